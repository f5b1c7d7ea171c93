"""Keras's ``class_weight``: each training sample's loss weighed by its class, over the samples.

Keras's ``fit(x, y, class_weight={0: 1.0, 1: 5.0})`` multiplies each sample's loss by its
class's weight and divides the sum by the samples (its ``sum_over_batch_size``), in training
only: the validation loss is the plain one. ``nn.CrossEntropyLoss(weight=w)`` divides by the
targets' weights instead (a weighted mean), so the two train at different scales whenever the
batch's mean weight is not 1, and a binary model on ``BCEWithLogitsLoss`` has no class weight
at all (``pos_weight`` weighs positives only). ``ClassWeights`` gives Keras's, exact on any split:
each part's weighted sum, divided once by the global batch's count (the samples; the elements of
a binary target, one a sample; the targets that are not ``ignore_index``).

>>> weights = ClassWeights({0: 1.0, 1: 5.0}, nn.CrossEntropyLoss())
>>> weights.weighted_sum(nn.CrossEntropyLoss(), logits, y)   # sum of cross_entropy(logits, y, reduction="none") * w[y]
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .loss_kinds import CLASSIFICATION

_BINARY = (nn.BCEWithLogitsLoss, nn.BCELoss)


def _table(class_weight: Any) -> Dict[int, float]:
    """``{class: weight}`` from Keras's dict, or a sequence (a list, tensor, array) by class."""
    if isinstance(class_weight, Mapping):
        items = list(class_weight.items())
    elif isinstance(class_weight, (list, tuple)) or hasattr(class_weight, "tolist"):
        values = class_weight.tolist() if hasattr(class_weight, "tolist") else list(class_weight)
        if not isinstance(values, list) or any(isinstance(v, list) for v in values):
            raise ValueError(f"class_weight as a sequence holds one weight a class, got the shape "
                             f"{tuple(getattr(class_weight, 'shape', ()))}")
        items = list(enumerate(values))
    else:
        raise TypeError(f"class_weight must be a dict {{class: weight}} (Keras's) or one weight a class (a list or "
                        f"tensor), got {type(class_weight).__name__}")
    table: Dict[int, float] = {}
    for key, value in items:
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or key < 0:
            raise ValueError(f"class_weight's keys are class indices (0, 1, ...), got {key!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
            raise ValueError(f"class_weight[{key}] must be a finite number >= 0, got {value!r}")
        table[int(key)] = float(value)
    if not table:
        raise ValueError("class_weight is empty: give a weight for each class to weigh, {class: weight}")
    return table


class ClassWeights:
    """Keras's ``class_weight`` for ``loss`` (a classification loss, or a binary one on 0/1
    targets); classes it does not name weigh 1, as in Keras."""

    def __init__(self, class_weight: Any, loss: Any):
        self.table = _table(class_weight)
        if not isinstance(loss, CLASSIFICATION + _BINARY):
            raise ValueError(f"class_weight weighs a classification loss (cross-entropy, NLL) or a binary one (bce, "
                             f"BCELoss), not {type(loss).__name__}: weigh the samples in your loss, loss=lambda out, "
                             f"y: (per_sample(out, y) * weights_of(y)).mean()")
        if getattr(loss, "weight", None) is not None:
            raise ValueError(f"class_weight and the loss's own weight= both weigh the classes ({type(loss).__name__}"
                             f"(weight=...) divides by the targets' weights, Keras's class_weight by the samples): "
                             f"give one")
        self.binary = isinstance(loss, _BINARY)
        if self.binary and set(self.table) - {0, 1}:
            raise ValueError(f"class_weight names classes {sorted(set(self.table) - {0, 1})}, and a binary loss has "
                             f"the classes 0 and 1 only")
        self._on: Dict[Tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._classes: Optional[int] = None         # checked against the model's at the first batch

    def _weights(self, classes: int, like: torch.Tensor) -> torch.Tensor:
        """One weight a class, on the device and in the dtype of the losses ``like`` (a float64
        model's weights as exact as its plain loop's); the first call checks the table against
        ``classes``."""
        if self._classes is None:
            beyond = sorted(k for k in self.table if k >= classes)
            if beyond:
                raise ValueError(f"class_weight names class {beyond[0]}, and the model gives {classes} classes "
                                 f"(0 to {classes - 1})")
            self._classes = classes
        key = (like.device, like.dtype)
        weights = self._on.get(key)
        if weights is None:         # (one thread a device: no two make the same)
            full = [self.table.get(c, 1.0) for c in range(self._classes)]
            weights = self._on[key] = torch.tensor(full, dtype=like.dtype, device=like.device)
        return weights

    def weighted_sum(self, loss: nn.Module, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The sum of ``loss``'s per-sample (per-element) values times their class's weight;
        ``output`` as the loss takes it (classes in dimension 1). Torch's own ``weight=`` with a
        sum is that sum in one operation (ignored targets left out) where it means Keras's: class
        indices without label smoothing, where torch would weigh the smoothing's classes too; a
        binary target's class is ``target > 0.5`` (Keras's round, half to even). Fused, a 128 x 4
        batch's forward and backward take 47 us against the per-sample product's 57 (unweighted:
        35; benchmarks/results/weights.json's "loss op", 2 CPU cores)."""
        if self.binary:
            weight = self.of_elements(output, target)
            if isinstance(loss, nn.BCELoss):
                return F.binary_cross_entropy(output, target, weight=weight, reduction="sum")
            pos_weight = loss.pos_weight
            if pos_weight is not None:
                pos_weight = pos_weight.to(output.device)
            return F.binary_cross_entropy_with_logits(output, target, weight=weight, pos_weight=pos_weight,
                                                      reduction="sum")
        smoothing = getattr(loss, "label_smoothing", 0.0)
        if not target.is_floating_point() and not smoothing:
            w = self._weights(output.shape[1], output)
            fused = F.nll_loss if isinstance(loss, nn.NLLLoss) else F.cross_entropy
            return fused(output, target, weight=w, ignore_index=loss.ignore_index, reduction="sum")
        # class probabilities (the most likely class, as Keras's argmax) or label smoothing: per sample
        per = F.cross_entropy(output, target, ignore_index=loss.ignore_index, reduction="none",
                              label_smoothing=smoothing)
        return (per * self.of_elements(output, target)).sum()      # (an ignored target's loss is 0)

    def of_elements(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Each sample's class weight, shaped as the loss's unreduced values (the target's,
        without the classes of probability targets): ``w[target]``, to multiply with the
        samples' own weights (``sample_weights.py``)."""
        if self.binary:
            check_binary(target)
            w = self._weights(2, output)
            return torch.where(target.detach() > 0.5, w[1], w[0])
        w = self._weights(output.shape[1], output)
        return w[target.argmax(1)] if target.is_floating_point() else w[target.clamp(min=0)]


def check_binary(target: torch.Tensor) -> None:
    """A binary target of one class a sample (``(N,)``, ``(N, 1)``), not several (multi-label)."""
    if target.dim() > 1 and any(s != 1 for s in target.shape[1:]):
        raise ValueError(f"class_weight weighs each sample by its one class, and the binary targets of shape "
                         f"{tuple(target.shape)} hold several a sample (multi-label): weigh them in your loss "
                         f"(BCEWithLogitsLoss(pos_weight=...) or a loss of your own)")
