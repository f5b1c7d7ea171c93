"""Keras's ``sample_weight``: each training sample's loss times its own weight, over the samples.

Keras's ``fit(x, y, sample_weight=w)`` multiplies each sample's loss by its weight and divides
the sum by the samples (``sum_over_batch_size``), in training; ``dptrain.fit(model, (X, y),
sample_weight=w)`` does the same, exact on any split: each device's part sums its weighted
losses, and the sum is divided once by the global batch's count (the samples; a target's
elements, a mean over each sample's as Keras takes it; the targets that are not
``ignore_index``). The weights ride in the training batches, last (``(x, y, w)``) or under the
key ``"sample_weight"`` of a dict batch (``data/sample_weights.py`` puts them there), so they
are cut with the samples; ``split_weights`` takes them out before the forward. Evaluation is
unweighted, as Keras's validation loss is without validation weights.

>>> batch, w = split_weights((x, y, w))      # ((x, y), w)
>>> weighted_sum(F.mse_loss(out, y, reduction="none"), w)     # sum of each sample's loss * w
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Tuple

import torch
from torch import nn

from ..data.sample_weights import WEIGHT_KEY


def split_weights(batch: Any) -> Tuple[Any, torch.Tensor]:
    """``batch`` without its weights, and the weights: a tuple's (or list's) last item, a dict's
    ``"sample_weight"``."""
    if isinstance(batch, Mapping):
        if WEIGHT_KEY not in batch:
            raise ValueError(f"sample_weight=True reads each training batch's weights from its {WEIGHT_KEY!r} key, "
                             f"and this dict batch has the keys {', '.join(map(str, batch))}: add them (in the "
                             f"Dataset or the collate_fn), or give fit sample_weight=<one weight a sample>")
        return {k: v for k, v in batch.items() if k != WEIGHT_KEY}, batch[WEIGHT_KEY]
    if isinstance(batch, (tuple, list)) and len(batch) >= 3:
        rest = batch[:-1]
        return (tuple(rest) if isinstance(batch, tuple) else rest), batch[-1]
    raise ValueError(f"sample_weight=True reads each training batch's weights as its last item, (x, y, w), and "
                     f"this batch is a {type(batch).__name__}"
                     f"{f' of {len(batch)} items' if isinstance(batch, (tuple, list)) else ''}: let the Dataset "
                     f"(or the collate_fn) give (x, y, w), a dict batch its {WEIGHT_KEY!r} key, or give fit "
                     f"sample_weight=<one weight a sample>")


def weighted_sum(per: torch.Tensor, weights: Any) -> torch.Tensor:
    """The sum of the per-sample (per-element: ``(N, ...)``) losses ``per`` times their sample's
    weight (``weights``: ``(N,)`` or ``(N, 1)``)."""
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"a batch's sample weights must be a tensor of one weight a sample, got "
                        f"{type(weights).__name__}")
    w = weights.reshape(-1) if weights.dim() > 1 and weights.numel() == weights.shape[0] else weights
    if w.dim() != 1 or per.dim() == 0 or w.shape[0] != per.shape[0]:
        raise ValueError(f"sample weights of shape {tuple(weights.shape)} for a batch of "
                         f"{per.shape[0] if per.dim() else 1} samples: give one weight a sample, (N,)")
    w = w.to(per.dtype)
    if per.dim() == 1:          # (one product and sum: 6 us of a 128 x 4 batch's 60, forward and backward)
        return torch.dot(per, w)
    return (per * w.view(-1, *([1] * (per.dim() - 1)))).sum()


def check_weighable(loss: Any, known: tuple) -> None:
    """``loss`` (as a module where torch has one) is one whose per-sample values are known:
    a torch classification or element-wise loss module without its own ``weight=``."""
    if not isinstance(loss, known):
        raise ValueError(f"sample_weight weighs a torch loss's per-sample values (cross-entropy, NLL, MSE, L1, "
                         f"Huber, BCE...), not {getattr(loss, '__name__', type(loss).__name__)}'s: for a loss of "
                         f"your own, read the weights from the batch, loss=lambda out, y, batch: "
                         f"((per_sample(out, y) * batch[2]).sum(), len(y)) with forward=lambda model, batch: "
                         f"(model(batch[0]), batch[1]), and no sample_weight")
    if isinstance(loss, nn.Module) and getattr(loss, "weight", None) is not None:
        raise ValueError(f"sample_weight and the loss's own weight= both weigh ({type(loss).__name__}(weight=...) "
                         f"divides by the targets' weights, Keras's sample_weight by the samples): give "
                         f"class_weight={{class: weight}} for the classes' weights beside sample_weight")
