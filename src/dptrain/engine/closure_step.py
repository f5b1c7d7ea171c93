"""An optimizer whose ``step`` needs a closure (``torch.optim.LBFGS``), on any devices and processes.

LBFGS evaluates the loss and its gradient several times a step (``max_iter``, and a line
search with ``line_search_fn="strong_wolfe"``), over every parameter at once, and decides
from those values how many evaluations to make and how far to go. A DDP script gives it a
closure whose backward sums the gradients over the processes (and must all-reduce the loss
itself, or the ranks decide apart). Here, as there, every device runs the optimizer over all
the parameters (``Trainer`` makes every device update all of them), each with a closure that

1. computes its part of the step's batch: the loss sum and its gradient (``StepPlan``, as
   any step's shards), nothing sent (``no_sync``);
2. sums the gradient, the loss sum and the count with every other device's and process's
   (one ``ThreadGroup.all_reduce``, float64, every device adding in the same order);
3. divides by the global count, and returns the loss: the batch's mean.

So every device gets the same loss and gradient at every evaluation, takes the same
decisions and makes the same update: N devices and N processes train as one device does
with ``optimizer.step(closure)`` on the whole batch. One device of one process has nothing to
sum: its closure is the plain loop's (``alone_step``: the loss as written, its backward).

Sharpness-Aware Minimization's ``step`` reads the gradient a backward left before it (then
evaluates at perturbed weights, then steps from the first weights): for it
(``Trainer.closure_after_backward``) the closure is called once before ``step``, as its users'
loops do ``loss.backward(); optimizer.step(closure)``. The step's loss is the first
evaluation's (what ``step`` returns, the loss before the update); the training figures
(``train_metrics``) count it alone. ``on_nan="skip"``: a first loss that is not finite
leaves the model as it was (no update has happened yet).

Not with ``accumulate_grad_batches`` (a closure evaluates one batch), float16 loss scaling,
gradient clipping (the line search's gradients are the loss's own), or a callback's
``on_gradients`` (no one gradient makes the update): each is refused.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..data.accumulate import MicroBatches
from ..data.batch import Batch, batch_size, to_device
from ..distributed.collective import get_collective
from ..parallel import bare_step
from ..parallel.syncbn import ThreadGroup
from . import direct_step as direct
from .direct_step import whole_loss
from .losses import add_counts, host_number
from .step_plan import StepPlan, StepResult

_LATE = ("a device did not reach the closure's exchange in time: every device evaluates the loss as often as the "
         "others (the same values, the same decisions); a device that failed says why above")


class _NotFinite(Exception):
    """The first evaluation's loss is not finite (``on_nan="skip"``): no update."""


def applies(engine: Any) -> bool:
    """Whether the engine's optimizer needs a closure (one optimizer: ``Trainer.needs_closure``)."""
    return getattr(engine.trainer, "needs_closure", False)


def check(engine: Any, batch: Batch) -> None:
    """A ValueError for a setting a closure's step cannot keep."""
    name = engine.trainer.optimizer_name
    refused = ("accumulate_grad_batches > 1 (a closure evaluates the loss of one batch; give a larger batch_size)"
               if isinstance(batch, MicroBatches) else
               "amp='fp16' (a loss scale changing between evaluations; amp='bf16' needs none)"
               if engine.loss_scale is not None else
               "clip_grad_norm or clip_grad_value (the line search needs the loss's own gradient)"
               if engine.clip_grad_norm is not None or engine.clip_grad_value is not None else
               "a callback's on_gradients (there is no one gradient of the update to give it: read the closure's "
               "in a step function of your own)" if getattr(engine.trainer, "keep_grads", False) else None)
    if refused:
        raise ValueError(f"{name}.step needs a closure, which evaluates the loss several times a step: it does not "
                         f"go with {refused}")


def closure_step(engine: Any, batch: Batch, skip_nonfinite: bool = False,
                 sizes: Optional[Sequence[int]] = None, timed: bool = False) -> StepResult:
    """One step of the closure's optimizer on this process's ``batch``; see the module docstring.
    ``sizes`` and ``timed`` as ``ModelEngine.train_batch`` takes them (``--balance``: each
    device's seconds are its evaluations' together)."""
    check(engine, batch)
    trainer, devices = engine.trainer, engine.devices
    if direct.applies(engine, batch, sizes, timed):
        return alone_step(engine, batch, skip_nonfinite)
    if engine.closure_group is None:        # (every process takes its first step: its group made alike)
        engine.closure_group = ThreadGroup(len(devices), collective=get_collective(new_group=True), late=_LATE)
    group = engine.closure_group
    first = engine._plan(batch, sizes)
    plans: Dict[int, StepPlan] = {0: first}
    lock = threading.Lock()

    def plan_of(k: int) -> StepPlan:
        # Evaluation k's plan: the same shards, fresh turns (dropout on CPU devices) and counts.
        with lock:
            if k not in plans:
                plans[k] = StepPlan(engine, first.shards, first.n, first.known, first.count)
                plans[k].scored = False
            return plans[k]
    firsts: List[Any] = [None] * len(devices)     # each device's first evaluation: (loss sum, count)
    finite = [True]         # the first evaluation's loss, over every device and process
    trainer.optimizer.push(zip(trainer._optimizers, trainer._origins))     # (a scheduler's learning rate)
    after_backward = trainer.closure_after_backward

    def on_device(i: int) -> Optional[BaseException]:
        params, device, evaluations = trainer._groups[i], devices[i], [0]

        def closure() -> torch.Tensor:
            k = evaluations[0]
            evaluations[0] += 1
            plan = plan_of(k)
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()
            value = plan.compute(timed)(i)
            count = host_number(plan.count if i == 0 else None) if plan.known else plan.counts[i]
            loss_sum, divisor = exchanged(group, i, device, params, value, count)
            if k == 0:
                firsts[i] = (value, count)
                if skip_nonfinite and not math.isfinite(loss_sum):
                    finite[0] = False
                    raise _NotFinite
            return torch.tensor(loss_sum / divisor, dtype=torch.float64, device=device)
        try:
            if after_backward:      # (SAM: its step reads the gradient at the weights as they are)
                closure()
            trainer._optimizers[i].step(closure)
        except _NotFinite:
            pass
        except BaseException as e:
            group.abort()           # (the others stop waiting for this device's part at once)
            return e
        return None

    with trainer.no_sync():
        errors = [e for e in engine.runner.map(on_device) if e is not None]
    if errors:          # the failed device's error, not the others' broken wait
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    trainer.discard_gradients()
    stepped = finite[0]
    if stepped:
        trainer._broadcast_buffers()
        trainer.optimizer.step()        # marks the step for lr schedulers
    loss = first.loss([v for v, _ in firsts])
    count = None
    for _, c in firsts:
        count = add_counts(count, c)
    if not stepped:
        loss = torch.full_like(loss, math.nan)
    seconds = [sum(plan.seconds[i] for plan in plans.values()) for i in range(len(devices))] if timed else None
    return StepResult(loss, first.n if count is None else count, stepped, seconds=seconds)


def alone_step(engine: Any, batch: Batch, skip_nonfinite: bool) -> StepResult:
    """One device of one process: the plain loop's closure (zero_grad, the loss as the user
    wrote it, backward), nothing to sum (as ``direct_step.py`` is for other optimizers)."""
    device, trainer = engine.devices[0], engine.trainer
    shard = to_device(batch, device, engine.memory_format)
    firsts: List[Any] = []

    def closure() -> torch.Tensor:
        bare_step.zero_grad(trainer._optimizers[0])
        value, count = whole_loss(engine, shard, device, scored=not firsts)
        value.backward()
        if not firsts:
            firsts.append((value.detach(), count))
            if skip_nonfinite and not bool(torch.isfinite(value)):
                raise _NotFinite
        return value.detach()
    trainer.optimizer.push(zip(trainer._optimizers, trainer._origins))     # (a scheduler's learning rate)
    stepped = True
    try:
        if trainer.closure_after_backward:
            closure()
        trainer._optimizers[0].step(closure)
    except _NotFinite:
        stepped = False
    trainer.discard_gradients()
    if stepped:
        trainer.optimizer.step()        # marks the step for lr schedulers
    loss, count = firsts[0]
    if not stepped:
        loss = torch.full_like(loss, math.nan)
    if count is None:       # a sum: what the general step gives
        return StepResult(loss.double(), batch_size(shard), stepped)
    return StepResult(loss, count, stepped, mean=True)


def exchanged(group: ThreadGroup, i: int, device: torch.device, params: List[torch.Tensor], value: torch.Tensor,
              count: Any) -> Tuple[float, float]:
    """Device ``i``'s gradient, loss sum and count summed with every device's and process's
    (float64, added in one order everywhere), each gradient left divided by the count; the
    loss sum and the count (1 for a sum: nothing to divide)."""
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    numbers = torch.stack([value.double().reshape(()).to(device),
                           torch.as_tensor(0.0 if count is None else count, dtype=torch.float64,
                                           device=device).reshape(()),
                           torch.tensor(float(count is not None), dtype=torch.float64, device=device)])
    total = group.all_reduce(i, torch.cat([g.reshape(-1).double() for g in grads] + [numbers]))
    loss_sum, counted, counters = total[-3:].tolist()
    divisor = counted if counters else 1.0
    start = 0
    with torch.no_grad():
        for p in params:
            mean = (total[start:start + p.numel()] / divisor).view(p.shape).to(p.dtype)
            start += p.numel()
            if p.grad is None:
                p.grad = mean
            else:
                p.grad.copy_(mean)
    return loss_sum, divisor
