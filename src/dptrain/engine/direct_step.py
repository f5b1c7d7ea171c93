"""One device of one process: nothing to sum, so a training step is the plain PyTorch loop.

The general step (``step_plan.py``, then ``Trainer.step_with``) has each shard compute its
loss *sum*, sums the gradients over devices and processes, and divides them once by the
global denominator. With one device in one process there is nothing to sum or split: the
loss as the user wrote it (its mean), backward, ``optimizer.step()`` and ``zero_grad()`` are
the whole step, as a plain loop writes them, and give the same gradient (the mean's is the
sum's divided by its count) without the layers between (the tiny MLP of issue 22 took
271 us a step through them against 154 us for the plain loop; see benchmarks/RESULTS.md).

``ModelEngine.train_batch`` takes this path whenever ``applies`` says so; what it returns
(``StepResult``) means what the general path's does.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import torch

from ..core import tracing as trace
from ..data.accumulate import MicroBatches
from ..data.batch import Batch, batch_size, to_device
from ..parallel.sync.base import Extras
from .sample_weights import split_weights
from .step_plan import StepResult

_NO_CHANGE = contextlib.nullcontext()


def applies(engine: Any, batch: Batch, sizes: Optional[Sequence[int]], timed: bool) -> bool:
    """Whether ``batch`` can take the direct step: one device, one process, nothing summed
    (``Trainer.alone``), not a group of micro-batches (their means would need weighting), no
    ``--balance`` split or timing, no synchronised BatchNorm (and ``engine.direct``, which
    tests turn off to compare the two paths)."""
    return (engine.direct and engine.trainer.alone and sizes is None and not timed and not engine.sync_batchnorm
            and not isinstance(batch, MicroBatches))


def direct_step(engine: Any, batch: Batch, skip_nonfinite: bool = False,
                extras: Extras = None) -> StepResult:
    """One step on ``batch`` on the engine's only device; see the module docstring."""
    device = engine.devices[0]
    shard = to_device(batch, device, engine.memory_format)
    traced = trace.recording()
    with trace.span("forward", 0) if traced else _NO_CHANGE, \
            (_NO_CHANGE if torch.is_grad_enabled() else torch.enable_grad()):
        value, count = whole_loss(engine, shard, device)
    scaler = engine.loss_scale         # float16: the loss scaled for backward (loss_scale.py)
    with trace.span("backward", 0) if traced else _NO_CHANGE:
        (value if scaler is None else value * scaler.scale).backward()
    if skip_nonfinite and not bool(torch.isfinite(value)):     # (a mean over no target, say): no update
        engine.trainer.discard_gradients()
        stepped, norm = False, None
    else:
        stepped, norm = engine.trainer.local_step(skip_nonfinite or scaler is not None, engine.clip_grad_norm,
                                                  engine.clip_grad_value, None if scaler is None else scaler.scale)
    overflow = scaler is not None and scaler.after_step(stepped, value)
    loss = value.detach()
    if not stepped and not overflow:
        loss = torch.full_like(loss, float("nan"))
    if count is None:       # a sum: what the general step gives
        return StepResult(loss.double(), batch_size(shard), stepped, extras, None, norm, overflow=overflow)
    return StepResult(loss, count, stepped, extras, None, norm, mean=True, overflow=overflow)


def whole_loss(engine: Any, shard: Batch, device: torch.device, scored: bool = True):
    """The loss as the plain loop has it (to run backward on: the mean, or the sum with a sum
    reduction) and its denominator (None: a sum). ``scored``: whether the training figures
    (``train_metrics``) count it."""
    net, figures = engine._net(0), engine.train_figures if scored else None
    if engine.adapter is not None:
        weights = None
        if engine.weighted:         # (Keras's sample_weight: the shard's last)
            shard, weights = split_weights(shard)
        with engine._autocast(device):
            output, target = engine.forward(net, shard)
            whole = engine.adapter.whole(output, target, shard, weights)
        if figures is not None:
            figures.add(0, output, target)
        return whole
    value, count, output, mean = engine.steps.loss(net, shard, engine._autocast(device))     # a step function's
    if figures is not None:
        figures.add_step_output(0, net, shard, output)
    return (value if mean or count is None else value / count), count
