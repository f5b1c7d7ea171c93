"""The user's loss, turned into shard sums and a denominator, so shards combine exactly.

One device on a global batch of N samples computes ``loss(model(X), y)``: with a ``mean``
reduction that is ``sum of per-sample losses / N`` (or a weighted count, for cross-entropy
with class weights or ignored targets), with ``sum`` it is the sum. Split over devices and
processes, each shard computes its *sum*, the sums are added in the gradients, and the
total is divided once by the global denominator: never a mean of means, never a second
division. ``LossAdapter`` knows how each torch loss defines its mean:

- ``nn.CrossEntropyLoss``/``NLLLoss`` (and ``F.cross_entropy``/``F.nll_loss``): the shard
  sum, over the targets that are not ``ignore_index``, weighted by ``weight[target]``;
  with class probabilities as targets, over positions;
- elementwise losses (``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``, ``BCELoss``,
  ``BCEWithLogitsLoss``, ``SoftMarginLoss``): over elements;
- ``KLDivLoss``: over elements, or samples with ``reduction="batchmean"``;
- any other callable: ``reduction="mean"`` (PyTorch's default) is a mean over the shard's
  samples, ``"sum"`` a sum; a ``step`` function may return ``(sum, count)`` to be exact
  whatever it computes.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

Count = Union[int, torch.Tensor, None]      # None: a sum reduction, nothing to divide by
REDUCTIONS = ("mean", "sum")

_ELEMENTWISE = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss, nn.BCELoss, nn.BCEWithLogitsLoss,
                nn.SoftMarginLoss)
_CLASSIFICATION = (nn.CrossEntropyLoss, nn.NLLLoss)
#: Functional losses with the module that means the same, for their default arguments.
_FUNCTIONS = {F.cross_entropy: nn.CrossEntropyLoss, F.nll_loss: nn.NLLLoss, F.mse_loss: nn.MSELoss,
              F.l1_loss: nn.L1Loss, F.smooth_l1_loss: nn.SmoothL1Loss, F.huber_loss: nn.HuberLoss,
              F.binary_cross_entropy: nn.BCELoss,
              F.binary_cross_entropy_with_logits: nn.BCEWithLogitsLoss}


def samples_of(target: Any) -> int:
    if isinstance(target, torch.Tensor):
        return target.shape[0] if target.dim() else 1
    return len(target)


class LossAdapter:
    """``adapter(output, target) -> shard sum``; ``adapter.count(target)`` -> its denominator.

    >>> adapter = LossAdapter(nn.MSELoss())
    >>> s = adapter(out_shard, y_shard)          # sum of squared errors of the shard
    >>> n = adapter.count(y_shard)               # its number of elements
    >>> # N shards: sum(s_i) / sum(n_i) == nn.MSELoss()(out, y) on the whole batch
    """

    def __init__(self, loss: Optional[Callable] = None, reduction: Optional[str] = None):
        loss = nn.CrossEntropyLoss() if loss is None else loss
        loss = _FUNCTIONS[loss]() if loss in _FUNCTIONS else loss
        if not callable(loss):
            raise TypeError(f"loss must be callable as loss(output, target), got {type(loss).__name__}")
        own = getattr(loss, "reduction", None) if isinstance(loss, nn.Module) else None
        if own is not None and reduction is not None and reduction != own:
            raise ValueError(f"reduction={reduction!r} contradicts the loss's own reduction {own!r}: set it on "
                             f"the loss, e.g. nn.MSELoss(reduction={reduction!r})")
        self.reduction = own or reduction or "mean"
        if self.reduction not in REDUCTIONS + ("batchmean",) or (self.reduction == "batchmean"
                                                                 and not isinstance(loss, nn.KLDivLoss)):
            raise ValueError(f"loss reduction {self.reduction!r} cannot be split over devices: use 'mean' or 'sum' "
                             f"(per-sample losses with reduction='none' must be reduced)")
        self.loss = loss
        self.classification = isinstance(loss, _CLASSIFICATION)
        self.known = isinstance(loss, _CLASSIFICATION + _ELEMENTWISE + (nn.KLDivLoss,))
        if self.known:      # the same loss, reduced by summation: exact shard sums
            self._sum = copy.copy(loss)
            self._sum.reduction = "sum"
        self._checked = False

    # -- per shard ---------------------------------------------------------------------
    def __call__(self, output: torch.Tensor, target: Any) -> torch.Tensor:
        """The shard's sum (the loss itself with a sum reduction)."""
        if self.classification and not self._checked:
            check_classification(output, target, self.loss)
            self._checked = True
        if self.known:
            value = self._sum(output, target)
        else:
            value = self.loss(output, target)
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"the loss returned {shape}, not one number: reduce it with 'mean' or 'sum'")
            value = value.reshape(())
            if self.reduction == "mean":
                value = value * samples_of(target)
        return value

    def count(self, target: Any) -> Count:
        """The denominator of a batch of ``target``s (a shard or a process's whole batch)."""
        if self.reduction == "sum":
            return None
        if not self.known or self.reduction == "batchmean":
            return samples_of(target)
        if self.classification and not target.is_floating_point():
            return class_count(target, self.loss)
        if self.classification:                   # class probabilities: a mean over positions
            return target.numel() // target.shape[1]
        return target.numel()

    def correct(self, output: torch.Tensor, target: Any) -> Optional[Tuple[torch.Tensor, Count]]:
        """``(correct, count)`` of the arg-max predictions, for classification losses."""
        if not self.classification or target.is_floating_point():
            return None
        hits = output.argmax(dim=1) == target
        ignore = getattr(self.loss, "ignore_index", -100)
        kept = target != ignore
        return (hits & kept).sum(), kept.sum()


def class_count(target: torch.Tensor, loss: nn.Module) -> torch.Tensor:
    """What cross-entropy's mean divides by: the weights of the targets that are not ignored."""
    kept = target != loss.ignore_index
    weight = getattr(loss, "weight", None)
    if weight is None:
        return kept.sum()
    return weight.to(target.device)[target.clamp(min=0) * kept].mul(kept).sum()


def check_classification(output: torch.Tensor, target: Any, loss: Callable) -> None:
    """A classification loss on targets it cannot fit is a clear error, not a silent 0."""
    name = type(loss).__name__
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{name} needs tensor targets, got {type(target).__name__}")
    if output.dim() < 2 or output.shape[1] < 2:
        raise ValueError(f"{name} needs one score per class in dimension 1 (at least 2 classes); the model gave "
                         f"shape {tuple(output.shape)}, for which the loss is always 0. For regression use "
                         f"loss=nn.MSELoss()")
    if not target.is_floating_point():
        ignore = getattr(loss, "ignore_index", -100)
        kept = target[target != ignore]
        if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= output.shape[1]):
            bad = int(kept.max()) if int(kept.max()) >= output.shape[1] else int(kept.min())
            raise ValueError(f"{name} got label {bad} for {output.shape[1]} classes (the model gives {output.shape[1]} "
                             f"scores per sample): labels must be in [0, {output.shape[1]}); give the model more "
                             f"outputs, or fix the labels")
    if target.is_floating_point():
        if target.shape != output.shape:
            raise ValueError(f"{name} got float targets of shape {tuple(target.shape)} for outputs of shape "
                             f"{tuple(output.shape)}: give class indices as integers (e.g. y.long()), or class "
                             f"probabilities of the outputs' shape; for regression use loss=nn.MSELoss()")
        sums = target.sum(dim=1)
        if bool((target < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            raise ValueError(f"{name} got float targets that are not class probabilities (each row >= 0, "
                             f"summing to 1): for regression use loss=nn.MSELoss(); for labels use integers")


def host_number(count: Count) -> Count:
    # A count computed on the host is a plain number: sending a CPU tensor into a GPU bucket
    # would wait for the GPU.
    if isinstance(count, torch.Tensor) and count.device.type == "cpu":
        value = count.item()
        return int(value) if float(value).is_integer() else value
    return count


def add_counts(a: Count, b: Count) -> Count:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device != b.device:
        b = b.to(a.device, non_blocking=True)
    return a + b
