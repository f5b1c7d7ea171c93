"""What a classification loss's mean divides by, per batch, computed one batch at a time or
many at once.

Cross-entropy (and NLL) with integer targets divides its sum by the weights of the targets
that are not ``ignore_index`` (their number, without class weights). A training step on one
device runs the loss's own mean and needs that count only for the epoch's loss figure, so it
hands on a ``LazyCount``; the epoch's tally (``run/tally.py``) computes the counts of many
steps in a few operations (``class_counts``), not two or three per step (on a GPU, each
operation a step costs host time: 27-40 us a step here, issue 22).

>>> lazy = LazyCount(y, nn.CrossEntropyLoss(ignore_index=0))
>>> float(lazy)                                  # computed when asked
>>> class_counts([lazy1, lazy2, lazy3])          # a float64 tensor of 3, in one go

When the training data are tensors in memory, their whole target column is read once at
set-up (``none_ignored``): if none of it is ``ignore_index`` and the loss weighs no class,
a step's count is its targets' number, a Python int: no LazyCount kept, nothing folded (on
this CPU the LazyCounts cost the tiny MLP's 240 us step 8-10 us, benchmarks/RESULTS.md).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch
from torch import nn


def class_count(target: torch.Tensor, loss: nn.Module, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """What cross-entropy's mean divides by: the weights of the targets that are not ignored
    (summed in ``dtype``: None for the targets' or the weights' own)."""
    kept = target != loss.ignore_index
    weight = getattr(loss, "weight", None)
    if weight is None:
        return kept.sum(dtype=dtype)
    return weight.to(target.device)[target.clamp(min=0) * kept].mul(kept).sum(dtype=dtype)


def none_ignored(loss: nn.Module, targets: Any) -> bool:
    """Whether ``loss``'s mean over any batch of ``targets`` (a training set's whole target
    column) divides by the batch's targets' number: integer targets, none of them the loss's
    ``ignore_index``, and no class ``weight`` (one operation, once)."""
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or \
            getattr(loss, "weight", None) is not None or not hasattr(loss, "ignore_index"):
        return False
    return not bool((targets == loss.ignore_index).any())


class KeptTargets:
    """Stands for a loss in ``LazyCount`` to count the targets that are not ``ignore_index``,
    unweighted: what accuracy divides by."""
    weight = None

    def __init__(self, ignore_index: int):
        self.ignore_index = ignore_index


class LazyCount:
    """``class_count(target, loss)``, computed when first asked (``value``, ``float``)."""
    __slots__ = ("target", "loss", "_value")

    def __init__(self, target: torch.Tensor, loss: "nn.Module | KeptTargets"):
        self.target, self.loss, self._value = target, loss, None

    def value(self) -> torch.Tensor:
        if self._value is None:
            self._value = class_count(self.target, self.loss)
        return self._value

    def __float__(self) -> float:
        return float(self.value())

    def __repr__(self) -> str:
        return f"LazyCount({float(self)})"


def class_counts(lazy: Sequence[LazyCount]) -> torch.Tensor:
    """The counts of many batches as one float64 tensor, in a few operations when they share
    a loss and a target shape (the usual case: every full batch of an epoch)."""
    first = lazy[0]
    done = [c._value for c in lazy]
    if all(v is None for v in done) and all(c.loss is first.loss and c.target.shape == first.target.shape
                                            for c in lazy):
        targets = torch.stack([c.target for c in lazy])
        kept = targets != first.loss.ignore_index
        weight = getattr(first.loss, "weight", None)
        w = kept if weight is None else weight.to(targets.device)[targets.clamp(min=0) * kept] * kept
        return w.reshape(len(lazy), -1).sum(1, dtype=torch.float64)
    values: List[torch.Tensor] = [c.value() for c in lazy]
    return torch.stack([v.to(torch.float64) for v in values])


def class_count_total(lazy: Sequence[LazyCount]) -> torch.Tensor:
    """The sum of many batches' counts, a float64 0-d tensor: one count over all their
    targets when they share a loss and a device, whatever their sizes (an evaluation's last
    batch is often shorter: counted one by one, 2 operations a batch)."""
    first = lazy[0]
    device = first.target.device
    if all(c._value is None and c.loss is first.loss and c.target.device == device for c in lazy):
        return class_count(torch.cat([c.target.reshape(-1) for c in lazy]), first.loss, torch.float64)
    return class_counts(lazy).sum()
