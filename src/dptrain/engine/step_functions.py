"""The user's step functions (``step=fn(model, batch) -> loss``, or several by update name):
what each returns, read as the engine needs it.

A step returns its loss as a mean over the shard's samples (the usual), a sum (with
``reduction="sum"``), or ``(sum, count)`` (a weighted or masked loss counting its own
denominator), and may return a dict or a Hugging Face output holding the loss and its
``logits`` (``model_outputs.read_step``). Which form a function returns is remembered once it has run:
then the batch alone tells the denominator before any forward (``known_count``), and with
several processes it rides in the last gradient bucket, not in a message of its own (each
GAN update's did: 0.9x DDP's speed, benchmarks/RESULTS.md session 28).

>>> steps = StepFunctions(task.step, task.reduction)
>>> value, count, output, mean = steps.loss(net, shard, autocast)    # as the step gave it
>>> steps.known_count(batch)                                         # (True, 64) once it ran

A step returning a sum over the batch (a VAE's ``reduction="sum"`` and summed KL, as PyTorch's
example writes it) is taken as a mean unless ``reduction="sum"`` says so: on one device that
trains as the plain loop, but on several each part's sum would count as its mean (half the
gradient on 2 devices, a third on 3), silently. So where the batch is cut into parts,
``check_sum`` asks the step once, before the first, on the first device's part and its two
halves (eval mode, no gradients, the random streams left as they were): the sum of the
halves' values is an error naming ``reduction="sum"``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, ContextManager, Dict, Optional, Tuple

import torch
from torch import nn

from ..core.modes import evaluating
from ..core.parts import even_parts
from ..data.accumulate import MicroBatches
from ..data.batch import Batch, batch_size, split_structure, to_device
from .losses import Count
from .model_outputs import read_step

Step = Callable[[nn.Module, Any], Any]


def explain_no_grad(e: RuntimeError) -> None:
    """A step function that takes gradients for its loss (a gradient penalty's
    ``torch.autograd.grad``) fails under evaluation's ``torch.no_grad()`` with torch's words
    only: add to the message why, and the fix, as the plain loop's own evaluation would not
    have called that code. Nothing changes for other errors, or when gradients are on."""
    if torch.is_grad_enabled() or "does not require grad" not in str(e) or not e.args:
        return
    e.args = (f"{e.args[0]} (dptrain runs step= under torch.no_grad() when it evaluates, and when it tries the "
              f"model on an evaluation batch before training: take the gradients your loss needs only while "
              f"training, under `if model.training:`, or run that part, its forward too, under "
              f"`with torch.enable_grad():`)",) + e.args[1:]


class StepFunctions:
    """``default``: the task's step function (None with several: each call names its own);
    ``reduction``: ``"sum"`` when a one-number loss is a sum over the shard."""

    def __init__(self, default: Optional[Step], reduction: Optional[str]):
        self.default, self.reduction = default, reduction
        self._pairs: Dict[Step, bool] = {}      # whether each returned (sum, count)

    def loss(self, net: nn.Module, shard: Batch, autocast: ContextManager,
             step: Optional[Step] = None, size: Optional[int] = None) -> Tuple[torch.Tensor, Count, Any, bool]:
        """``step``'s loss on ``shard`` as it gave it: ``(value, denominator, output, mean)``,
        ``mean`` when the value is a mean over the denominator's samples (else a sum; one
        device of one process trains on it as it is, ``direct_step.py``), ``output`` what it
        returned besides its loss (its ``logits``, for metrics; None if none). ``size``: the
        shard's samples when the caller knows them (several steps on one shard count it once)."""
        step = step or self.default
        try:
            with autocast:
                out, output = read_step(step(net, shard))
        except RuntimeError as e:
            explain_no_grad(e)
            raise
        if isinstance(out, (tuple, list)):
            if len(out) != 2:
                raise ValueError(f"step returned {len(out)} values: return the loss, or (sum, count)")
            self._pairs[step] = True
            return out[0].reshape(()), out[1], output, False
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise ValueError(f"step must return the loss (one number) or (sum, count), got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        self._pairs[step] = False
        value = out if out.dim() == 0 else out.reshape(())      # (a view: an operation, and one in backward)
        if self.reduction == "sum":
            return value, None, output, False
        return value, batch_size(shard) if size is None else size, output, True

    def sum_loss(self, net: nn.Module, shard: Batch, autocast: ContextManager,
                 step: Optional[Step] = None) -> Tuple[torch.Tensor, Count, Any]:
        """``loss``'s value as a sum over the shard, its denominator and the output."""
        value, denominator, output, mean = self.loss(net, shard, autocast, step)
        return (value * denominator if mean else value), denominator, output

    def known_count(self, batch: Batch, step: Optional[Step] = None) -> Tuple[bool, Count]:
        """This process's denominator for ``step`` on ``batch`` before any forward, if the batch
        alone tells it (the function has run: its form is known); else ``(False, None)``."""
        pairs = self._pairs.get(step or self.default)
        if pairs is False:
            return True, (None if self.reduction == "sum" else batch_size(batch))
        return False, None

    def counts_numbers(self, step: Optional[Step] = None) -> bool:
        """Whether ``step``'s denominator counted after the forward is a number (None: a sum)."""
        return self._pairs.get(step or self.default) is not False or self.reduction != "sum"


def _value(step: Step, net: nn.Module, batch: Batch) -> Optional[float]:
    """The one number ``step`` returns on ``batch`` (None: a ``(sum, count)`` or anything else)."""
    out, _ = read_step(step(net, batch))
    return float(out) if isinstance(out, torch.Tensor) and out.numel() == 1 else None


def check_sum(engine: Any, batch: Batch) -> bool:
    """Before the first step of a step function taken as a mean (no ``reduction=``) on batches
    cut into several parts: its value on the first device's part against its two halves'
    (see the module); a sum is a ``ValueError`` naming ``reduction="sum"``. Returns whether it
    asked (False: a part of one sample; ask on the next batch). A step that fails so, or is
    neither a mean nor a sum (random draws of its own, samples coupled), is not told."""
    first = batch[0] if isinstance(batch, MicroBatches) else batch
    net, device = engine.replicas[0], engine.devices[0]
    try:
        n = even_parts(batch_size(first), len(engine.devices))[0]
        if n < 2:
            return False
        part, h = split_structure(first, [n, batch_size(first) - n])[0], n // 2
        with evaluating(net), torch.no_grad(), engine._autocast(device), \
                torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            values = [_value(engine.steps.default, net, to_device(b, device, engine.memory_format))
                      for b in [part, *split_structure(part, [h, n - h])]]
    except Exception:       # noqa: BLE001 - a batch that cannot be cut (a graph batch), a step not called so
        return True         # (a gradient penalty's autograd.grad): not told
    if any(v is None or not math.isfinite(v) for v in values):
        return True
    whole, a, b = values

    def near(x: float, y: float) -> bool:
        return abs(x - y) <= 1e-3 * max(abs(x), abs(y), 1e-12)
    if near(whole, a + b) and not near(whole, (a * h + b * (n - h)) / n):
        name = getattr(engine.steps.default, "__name__", type(engine.steps.default).__name__)
        parts = len(engine.devices) * (engine.trainer.world_size if engine.trainer is not None else 1)
        raise ValueError(f"step={name} returns a sum over the samples (its value on a batch, {whole:.6g}, is the "
                         f"sum of its values on the two halves, {a:.6g} and {b:.6g}), but is taken as a mean (the "
                         f"default without reduction=), and the batch is cut into {parts} parts (devices and "
                         f"processes): each part's sum would count as its mean, and the training would change with "
                         f"their number. Pass reduction='sum' to fit (then every device count trains as one device "
                         f"on the whole batch), or return the mean")
    return True
