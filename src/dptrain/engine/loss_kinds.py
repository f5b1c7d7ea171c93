"""What dptrain knows of a loss before it meets a batch: its kind, its torch module, what it is called with.

Torch's classification losses (cross-entropy, NLL) and element-wise ones (MSE, L1, Huber,
BCE...) define their means in known ways (``losses.LossAdapter`` sums their shards exactly); a
functional loss torch has a module for (``F.cross_entropy``, a ``functools.partial`` of one) is
taken as that module (``as_module``); a loss of the user's own may ask for the batch
(``takes_batch``).

>>> as_module(functools.partial(F.cross_entropy, label_smoothing=0.1))   # nn.CrossEntropyLoss(label_smoothing=0.1)
>>> scores_accuracy(nn.NLLLoss()), takes_batch(lambda out, y, batch: 0)  # (True, True)
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batch import batch_size

REDUCTIONS = ("mean", "sum")

ELEMENTWISE = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss, nn.BCELoss, nn.BCEWithLogitsLoss,
               nn.SoftMarginLoss)
CLASSIFICATION = (nn.CrossEntropyLoss, nn.NLLLoss)
#: The losses whose per-sample values ``sample_weight`` weighs (``sample_weights.py``).
WEIGHABLE = CLASSIFICATION + ELEMENTWISE
#: Elementwise losses torch computes on float targets only (MSE, L1... take integers too, in
#: torch's recent versions: ``loss_checks.trains_on_integers``).
FLOAT_TARGETS = (nn.BCELoss, nn.BCEWithLogitsLoss, nn.HuberLoss)
#: Functional losses with the module that means the same, for their default arguments.
FUNCTIONS = {F.cross_entropy: nn.CrossEntropyLoss, F.nll_loss: nn.NLLLoss, F.mse_loss: nn.MSELoss,
             F.l1_loss: nn.L1Loss, F.smooth_l1_loss: nn.SmoothL1Loss, F.huber_loss: nn.HuberLoss,
             F.binary_cross_entropy: nn.BCELoss,
             F.binary_cross_entropy_with_logits: nn.BCEWithLogitsLoss}


def batch_taken(loss: Callable) -> Callable:
    """``loss(output, target, batch)`` as ``fn(output, (target, batch))``, named as ``loss``: the
    reduction check cuts the pair into halves with the outputs."""
    def with_batch(output: Any, target_and_batch: Any) -> Any:
        return loss(output, *target_and_batch)
    with_batch.__name__ = getattr(loss, "__name__", type(loss).__name__)
    return with_batch


def samples_of(target: Any, output: Any = None) -> int:
    """The samples a loss's mean is over: the target's, or the output's where it has none
    (a contrastive loss's ``(views, None)``)."""
    if target is None and output is not None:
        return batch_size(output)
    if isinstance(target, torch.Tensor):
        return target.shape[0] if target.dim() else 1
    if isinstance(target, (tuple, list, Mapping)):        # (y, weight), {"y": ..., "w": ...}
        return batch_size(target)
    return len(target)


def as_module(loss: Any) -> Any:
    """A functional loss torch has a module for as that module, so its count is known (ignored
    targets, elements): ``F.cross_entropy``, or ``functools.partial(F.cross_entropy,
    label_smoothing=0.1)`` as ``nn.CrossEntropyLoss(label_smoothing=0.1)``; another as it is."""
    function, keywords = loss, {}
    if isinstance(loss, functools.partial) and not loss.args:
        function, keywords = loss.func, loss.keywords
    try:
        module = FUNCTIONS.get(function)
    except TypeError:       # (an object that cannot be hashed: a loss of the user's own)
        return loss
    if module is None:
        return loss
    try:
        return module(**keywords)
    except TypeError:       # a keyword the module does not take: the function as it is
        return loss


def scores_accuracy(loss: Any) -> bool:
    """Whether ``fit`` counts correct predictions (``test_acc``) with ``loss`` (and no step
    function): a classification loss, the default cross-entropy included."""
    return loss is None or isinstance(as_module(loss), CLASSIFICATION)


def takes_batch(loss: Callable) -> bool:
    """Whether a loss function asks for the batch: ``loss(output, target, batch)``, a third
    argument it needs (one with a default, a ``weight=None`` of torch's, is not asked for)."""
    try:
        params = inspect.signature(loss).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    needed = [p for p in positional if p.default is inspect.Parameter.empty]
    return len(needed) >= 3 or any(p.name == "batch" for p in params)
