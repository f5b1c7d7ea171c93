"""The step of several devices (or processes): each device's part of the batch forward and
backward on its thread, the gradients summed over every device and process by the ``Trainer``
and divided once by the global denominator, one update. Micro-batches (``accumulate_grad_batches``,
``--balance``'s groups) are summed on the devices first, nothing sent until the last.

``ModelEngine.train_batch`` takes this step where no other applies (``direct_step.py``: one
device of one process; ``closure_step.py``, ``updates.py``, ``manual_optimization.py``: steps of
other shapes); each batch's work on the devices is a ``StepPlan`` (``step_plan.py``).

>>> result = summed_step(engine, batch, False, None, None, False)     # a StepResult
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

import torch

from ..data.accumulate import micro_batches
from ..data.batch import Batch
from ..parallel.sync.base import Extras
from .losses import Count, add_counts
from .step_plan import StepResult


def summed_step(engine: Any, batch: Batch, skip_nonfinite: bool, extras: Extras, sizes: Optional[Sequence[int]],
                timed: bool) -> StepResult:
    """One step of ``engine`` on this process's ``batch`` (see ``ModelEngine.train_batch``)."""
    micro, each = micro_batches(batch, sizes)      # (--balance: each micro-batch's parts)
    loss: Optional[torch.Tensor] = None
    denominator: Count = None
    n = 0
    if len(micro) > 1:
        with engine.trainer.no_sync():            # the gradients stay on the devices, summed
            for part, parts in zip(micro[:-1], each[:-1]):
                shard_loss, count, size = micro_batch(engine, part, parts)
                loss = shard_loss if loss is None else loss + shard_loss
                denominator, n = add_counts(denominator, count), n + size
    before = denominator
    plan = engine._plan(micro[-1], each[-1])
    n += plan.n
    if plan.known and engine.trainer.world_size == 1 and nothing_counted(plan.denominator(before)):
        engine.trainer.discard_gradients()    # every target ignored (or weighing 0): a NaN mean, no update
        return StepResult(torch.full((), math.nan, dtype=torch.float64, device=engine.devices[0]), 0, False)
    divisor = plan.denominator(before) if plan.known else lambda: add_counts(before, plan.shard_counts())
    scaler = engine.loss_scale
    outcome = engine.trainer.step_with(plan.compute(timed), divisor if scaler is None else
                                       scaler.scaled_denominator(divisor, engine.loss_factor),
                                       ignore_stale_grad=True, skip_nonfinite=skip_nonfinite or scaler is not None,
                                       extras=extras, max_norm=engine.clip_grad_norm,
                                       max_value=engine.clip_grad_value)
    last_loss = plan.loss(outcome.outputs)
    loss = last_loss if loss is None else loss + last_loss
    denominator = plan.denominator(before) if plan.known else add_counts(before, plan.shard_counts())
    overflow = scaler is not None and scaler.after_step(outcome.stepped, loss)
    if not outcome.stepped and not overflow:
        loss = torch.full_like(loss, math.nan)
    return StepResult(loss, n if denominator is None else denominator, outcome.stepped, outcome.summed_extras,
                      plan.seconds if timed else None, outcome.grad_norm, overflow=overflow)


def micro_batch(engine: Any, batch: Batch, sizes: Optional[Sequence[int]]) -> Tuple[torch.Tensor, Count, int]:
    """Forward and backward of one micro-batch on every device, nothing sent: its loss
    sum, its denominator and its number of samples."""
    plan = engine._plan(batch, sizes)
    outputs = engine.runner.map(plan.compute(False))
    return plan.loss(outputs), plan.denominator(None) if plan.known else plan.shard_counts(), plan.n


def nothing_counted(denominator: Count) -> bool:
    """Whether a known denominator is 0 (a number: no wait): the batch's mean is 0/0."""
    return not isinstance(denominator, torch.Tensor) and denominator is not None and denominator == 0
