"""Several optimizers, each with a step of its own, taking turns on every batch (a GAN).

    dptrain.fit(gan, images,
                step={"discriminator": d_step, "generator": g_step},      # fn(model, batch) -> loss
                optimizer={"discriminator": Adam(gan.discriminator.parameters(), lr=2e-4),
                           "generator": Adam(gan.generator.parameters(), lr=2e-4)})

For each name in order, a batch runs that step's loss on every device's part (only that
optimizer's parameters requiring gradients: ``Trainers.toggled``), sums the gradients over
devices and processes, divides them once by the global denominator and updates; the next
step sees the updated weights. That is the plain loop on one device (DCGAN's, a Keras
``train_step`` with two optimizers, Lightning's manual optimization). Each step's loss is a
figure of its own, ``train_<name>_loss``, summed as the loss is; ``train_loss`` is their sum.
An evaluation set is scored by each step in eval mode without gradients (the weights as the
epoch left them): ``test_<name>_loss``, and ``test_loss`` their sum, which early stopping,
the best checkpoint and a plateau scheduler can watch; ``metrics`` score what ``forward``
(default ``model(x)`` against ``y``) gives, as with one optimizer (a domain-adversarial
classifier's accuracy).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence

import torch

from ..data.accumulate import micro_batches
from ..data.batch import Batch, batch_size
from ..parallel.combined import CombinedOptimizer
from ..parallel.sync.base import Extras
from ..parallel.trainers import check_optimizers
from .losses import add_counts
from .step_plan import StepResult


def check_updates(task: Any) -> None:
    """A ``TypeError`` or ``ValueError`` naming the fix unless ``task``'s several optimizers
    are well given: ``step`` and ``optimizer`` dicts with the same names, each optimizer built
    on its own parameters of the model; and nothing given that applies to one optimizer."""
    step, optimizer = task.step, task.optimizer       # (optimizer None: evaluation alone, dptrain.evaluate)
    if not isinstance(step, dict) or not isinstance(optimizer, (dict, type(None))):
        raise TypeError("a dict of steps takes turns, one optimizer each: give step={name: fn(model, batch) -> loss} "
                        "and optimizer={name: an optimizer built on the parameters that step trains}, with the same "
                        "names (several optimizers on one loss take one step: step=fn, optimizer={name: optimizer})")
    if not step:
        raise ValueError("step is an empty dict: give one step function per optimizer")
    if optimizer is not None and set(step) != set(optimizer):
        raise ValueError(f"step and optimizer must name the same updates: step has {sorted(step)}, optimizer "
                         f"{sorted(optimizer)}")
    for name, fn in step.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"update names must be identifiers (they name figures: train_<name>_loss), got {name!r}")
        if not callable(fn):
            raise TypeError(f"step[{name!r}] must be a function (model, batch) -> loss, got {type(fn).__name__}")
    if optimizer is not None:
        check_optimizers(optimizer, task.model)
    if isinstance(task.scheduler, dict):
        check_named(task.scheduler, step, ValueError,
                    f"scheduler must be {{update name: fn(optimizer) -> scheduler}} for some of {sorted(step)}")
    one = [what for what, given in (("optimizer_params", task.optimizer_params), ("lr", task.lr)) if given]
    if one:
        raise ValueError(f"{', '.join(one)}: not taken with several optimizers (set each optimizer's own lr)")


def combined(optimizers: Any, model: torch.nn.Module) -> CombinedOptimizer:
    """Several optimizers given with one step (or loss): one ``CombinedOptimizer`` of them, once
    each is seen built on its own parameters of ``model``; a ``TypeError`` or ``ValueError``
    naming the fix otherwise."""
    named = optimizers if isinstance(optimizers, dict) else dict(enumerate(optimizers))
    if not named:
        raise ValueError("optimizer is empty: give one optimizer, or several built on their parameters")
    check_optimizers(named, model)      # (each an optimizer, on the model's parameters, none in two)
    return CombinedOptimizer(optimizers)


def part_schedulers(scheduler: Any, optimizer: Any) -> Any:
    """The scheduler as ``fit`` takes it for one optimizer, ``optimizer`` (combined or not):
    one over all of its groups, or for a combined one ``{name: fn(optimizer) -> scheduler}``
    for some of its parts (a list with one per part is named as they are; None for none).
    A ``TypeError`` naming the fix for a dict or list that does not fit."""
    if not isinstance(scheduler, (dict, list, tuple)):
        return scheduler
    if not isinstance(optimizer, CombinedOptimizer):
        raise TypeError("scheduler: a dict or list of schedulers goes with several optimizers (optimizer={name: "
                        "optimizer} or a list); for one optimizer give one fn(optimizer) -> scheduler")
    names = list(optimizer.optimizers)
    if isinstance(scheduler, (list, tuple)):
        if len(scheduler) != len(names):
            raise TypeError(f"scheduler: a list needs one entry (or None) per optimizer, {len(names)} here "
                            f"({', '.join(names)}); got {len(scheduler)}")
        scheduler = dict(zip(names, scheduler))
    scheduler = {name: f for name, f in scheduler.items() if f is not None}
    check_named(scheduler, names, TypeError, f"scheduler: {{optimizer name: fn(optimizer) -> scheduler}} for some "
                                             f"of {names} (or one fn over all of their groups)")
    return scheduler


def check_named(schedulers: Dict[str, Any], names: Any, error: type, fix: str) -> None:
    """An ``error`` saying ``fix`` unless ``schedulers`` maps some of ``names`` to functions."""
    unknown = sorted(set(schedulers) - set(names))
    if unknown or not all(callable(f) for f in schedulers.values()):
        raise error(f"{fix}; got {'unknown names ' + str(unknown) if unknown else 'a value not callable'}")


#: Settings of a run not taken with several optimizers yet: (setting, when it is in force).
NOT_WITH_SEVERAL = {
    "compile": bool,
    "train_metrics": bool,
    "lr": lambda v: v is not None,
}


def check_settings(settings: Dict[str, Any]) -> None:
    """A ``ValueError`` naming the settings in force that several optimizers do not take."""
    refused = [name for name, used in NOT_WITH_SEVERAL.items() if name in settings and used(settings[name])]
    if refused:
        raise ValueError(f"{', '.join(refused)}: not taken with several optimizers (step and optimizer dicts) yet; "
                         f"leave {'it' if len(refused) == 1 else 'them'} out")


def several_step(engine: Any, batch: Batch, skip_nonfinite: bool, extras: Extras, timed: bool,
                 sizes: Optional[Sequence[Any]] = None) -> StepResult:
    """One batch: each update in turn (see the module docstring). The result's loss is the
    updates' loss sums added (NaN if one did not update), its count this process's samples,
    its ``grad_norm`` each update's by name (with clipping or ``log_grad_norm``); each
    update's ``(sum, count)`` goes to the training figures.

    A group of micro-batches (``accumulate_grad_batches``) is one step as Accelerate's
    ``accumulate`` makes it of a loop stepping each optimizer in turn: every micro-batch runs
    each update's step in turn, its gradients kept on the devices, and only the last one's
    turns update (each over the group's gradient sum and denominator), so the earlier
    micro-batches see the weights as the group found them. Under float16 one scale serves every
    update (torch's AMP recipe with one ``GradScaler`` for several optimizers). ``sizes``
    (``--balance``): each device's part of the batch, or of each micro-batch (a list each),
    the same for every update."""
    trainers, figures = engine.trainer, engine.train_figures
    names = trainers.names
    micro, each = micro_batches(batch, sizes)
    early = {name: (None, None) for name in names}      # each update's loss sum and count so far
    for part, parts in zip(micro[:-1], each[:-1]):
        for name in names:
            with trainers.toggled(name) as trainer, trainer.no_sync():
                plan = engine._plan(part, parts, step=engine.task.step[name])
                loss = plan.loss(engine.runner.map(plan.compute(False)))
            summed, before = early[name]
            early[name] = (loss if summed is None else summed + loss,
                           plan.denominator(before) if plan.known else add_counts(before, plan.shard_counts()))
    last, n = micro[-1], sum(batch_size(m) for m in micro)
    scaler = engine.loss_scale      # float16: one scale for every update, as one GradScaler
    total, stepped, seconds, flags, norms = None, True, None, None, {}
    for k, name in enumerate(names):
        summed, before = early[name]
        plan = engine._plan(last, each[-1], step=engine.task.step[name])
        # (not known before the step has run: the shards count it)
        divisor = plan.denominator(before) if plan.known else lambda: add_counts(before, plan.shard_counts())
        if scaler is not None:
            divisor = scaler.scaled_denominator(divisor, engine.loss_factor)
        with trainers.toggled(name) as trainer:
            outcome = trainer.step_with(plan.compute(timed), divisor, ignore_stale_grad=True,
                                        skip_nonfinite=skip_nonfinite or scaler is not None,
                                        extras=extras if k == len(names) - 1 else None,
                                        max_norm=engine.clip_grad_norm, max_value=engine.clip_grad_value)
        loss = plan.loss(outcome.outputs) if summed is None else summed + plan.loss(outcome.outputs)
        count = plan.denominator(before) if plan.known else add_counts(before, plan.shard_counts())
        figures.add_sums(f"{name}_loss", loss, n if count is None else count)     # (None: a sum's)
        total = loss if total is None else total + loss
        stepped = stepped and outcome.stepped
        flags = outcome.summed_extras
        if outcome.grad_norm is not None:       # (clipping or log_grad_norm: each update's own)
            norms[name] = outcome.grad_norm
        if timed:
            seconds = plan.seconds if seconds is None else [a + b for a, b in zip(seconds, plan.seconds)]
    # float16: an update whose gradients overflowed was skipped, the others stepped; the
    # scale halves once (GradScaler's update after every optimizer's step)
    overflow = scaler is not None and scaler.after_step(stepped, total)
    if not stepped and not overflow:
        total = torch.full_like(total, math.nan)
    return StepResult(total, n, stepped, flags, seconds, norms or None, overflow=overflow)
