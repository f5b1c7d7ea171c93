"""Keras's ``sample_weight`` beside the training data: each batch made to carry its samples' weights.

``fit(model, (X, y), sample_weight=w)`` (one weight a sample, as Keras's ``fit(x, y,
sample_weight=w)``) trains on batches ``(x, y, w)``: columns in memory get ``w`` as their last
column (a dict of them, the key ``"sample_weight"``), a ``TensorDataset`` a last tensor, any other
map-style ``Dataset`` (or list of samples) gives ``(sample, w[i])`` pairs, which the collate
function (yours or torch's) makes into the batch of samples with the weights put last. The engine
takes them out before the forward (``engine/sample_weights.py``). With ``validation_split`` the
training part's weights are its rows', the first (the held-out part's, the last, weigh its
``test_loss``, as Keras splits ``sample_weight`` with ``x`` and ``y``: ``run/build.py``).

An evaluation set given as Keras's ``validation_data=(x_val, y_val, val_sample_weight)``, one
column more than a training sample's items, carries its weights last too (``weights_carried``):
its ``test_loss`` is weighed as ``dptrain.evaluate(..., sample_weight=w)``'s.

>>> data, collate = weighed((X, y), as_weights(w, 1000), None)      # ((X, y, w), None)
>>> weights_carried((X_val, y_val, w_val), 2)                        # w_val checked, as a tensor
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from .choose_loader import samples_listed
from .holdout import data_length

#: A dict batch's key holding its samples' weights.
WEIGHT_KEY = "sample_weight"


def as_weights(weights: Any, samples: int) -> torch.Tensor:
    """``weights`` (a list, an array, a tensor) as a tensor of one finite weight >= 0 for each of
    ``samples``; a ``ValueError`` naming what is wrong."""
    if isinstance(weights, (str, bytes, Mapping)) or not hasattr(weights, "__len__"):
        raise TypeError(f"sample_weight is one weight a training sample (a list, an array or a tensor), or True "
                        f"where the batches carry them last, (x, y, w); got {type(weights).__name__}"
                        f"{' (weights by class: class_weight={class: weight})' if isinstance(weights, Mapping) else ''}")
    w = weights.detach() if isinstance(weights, torch.Tensor) else torch.as_tensor(np.asarray(weights))
    if w.dim() == 2 and w.shape[1] == 1:        # (Keras's (N, 1) weights)
        w = w.reshape(-1)
    if w.dim() != 1:
        raise ValueError(f"sample_weight holds one weight a sample, shape ({samples},); got {tuple(w.shape)}")
    if w.dtype == torch.bool or w.is_complex():
        raise TypeError(f"sample_weight's weights are numbers, got {w.dtype}")
    if not w.is_floating_point():
        w = w.to(torch.get_default_dtype())
    if len(w) != samples:
        raise ValueError(f"sample_weight has {len(w)} weights, and the training data {samples} samples: give one "
                         f"weight a sample, in the data's order")
    bad = ~torch.isfinite(w) | (w < 0)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"sample_weight[{i}] is {w[i].item()!r}: every weight must be a finite number >= 0")
    return w


def weights_for(data: Any, weights: Any) -> Any:
    """``weights`` checked against ``data`` (the training data as given): a tensor of one a
    sample, or ``True`` (the batches carry them) or None as they are."""
    if weights is None or weights is True:
        return weights
    if isinstance(data, DataLoader):
        raise ValueError("sample_weight with a DataLoader: give its Dataset as the data (fit(model, dataset, "
                         "sample_weight=w, batch_size=N, collate_fn=...)), or let its batches carry the weights, "
                         "(x, y, w), with sample_weight=True")
    if isinstance(data, IterableDataset):
        raise ValueError("sample_weight beside an IterableDataset: its samples have no index to weigh by; let it "
                         "yield (x, y, w) and give sample_weight=True")
    return as_weights(weights, data_length(data, "sample_weight"))


def weights_carried(data: Any, items: Optional[int]) -> Optional[torch.Tensor]:
    """The weights of an evaluation set of columns with one more than a training sample's
    ``items`` (weights left out), whose last is one number a sample: Keras's
    ``validation_data=(x_val, y_val, val_sample_weight)``, checked as ``as_weights``; None for
    any other set (a model of two inputs evaluates on ``(x1, x2, y)`` as it trains)."""
    if items is None or not isinstance(data, (tuple, list)) or len(data) != items + 1 or samples_listed(data):
        return None
    last = data[-1]
    if not isinstance(last, (torch.Tensor, np.ndarray)) or not (last.ndim == 1 or last.ndim == 2
                                                                and last.shape[1] == 1):
        return None
    samples = data_length(data[:-1], "validation weights")
    return as_weights(last, samples) if len(last) == samples else None


def weighed(data: Any, weights: Any, collate_fn: Optional[Callable]) -> Tuple[Any, Optional[Callable]]:
    """``data`` (and its collate function) whose batches carry ``weights`` last (a tensor from
    ``weights_for``, cut to the data's length: the training part of a ``validation_split``)."""
    if not isinstance(weights, torch.Tensor):
        return data, collate_fn
    weights = weights[:data_length(data, "sample_weight")]
    if isinstance(data, TensorDataset):
        return TensorDataset(*data.tensors, weights), collate_fn
    if isinstance(data, (tuple, list)) and not samples_listed(data):        # columns (X, y)
        return (*data, weights), collate_fn
    if isinstance(data, dict) and data and all(isinstance(t, (torch.Tensor, np.ndarray)) for t in data.values()):
        if WEIGHT_KEY in data:
            raise ValueError(f"the data holds a {WEIGHT_KEY!r} key already: give sample_weight=True to train on its "
                             f"weights, or rename it")
        return {**data, WEIGHT_KEY: weights}, collate_fn
    if isinstance(data, Dataset) or isinstance(data, (list, tuple)):
        return WeightedSamples(data, weights), WeightsLast(collate_fn or default_collate, weights.dtype)
    raise TypeError(f"sample_weight cannot weigh a {type(data).__name__}: give tensors (X, y), a Dataset, or "
                    f"batches carrying the weights with sample_weight=True")


class WeightedSamples(Dataset):
    """``(data[i], weights[i])``: a sample and its weight (``WeightsLast`` collates them). The
    weights are kept as numbers: a tensor's ``weights[i]`` and a stack of them took 1.6 us a
    sample and 50 us a batch of 64 here, a tensor of a batch's numbers 5 us."""

    def __init__(self, data: Any, weights: torch.Tensor):
        self.data, self.weights = data, weights.tolist()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Tuple[Any, float]:
        return self.data[i], self.weights[i]


class WeightsLast:
    """``collate_fn`` of ``(sample, weight)`` pairs: the batch ``collate`` makes of the samples,
    the weights put last (a dict batch: under ``"sample_weight"``)."""

    def __init__(self, collate: Callable, dtype: torch.dtype):
        self.collate, self.dtype = collate, dtype

    def __call__(self, pairs: Any) -> Any:
        batch = self.collate([sample for sample, _ in pairs])
        weights = torch.tensor([w for _, w in pairs], dtype=self.dtype)
        if isinstance(batch, Mapping):
            return {**batch, WEIGHT_KEY: weights}
        if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
            return (*batch, weights)
        raise TypeError(f"sample_weight with a Dataset puts each batch's weights last, and its collate function "
                        f"made a {type(batch).__name__}: let it return (x, ..., y) or a dict, or let the batches "
                        f"carry the weights with sample_weight=True")
