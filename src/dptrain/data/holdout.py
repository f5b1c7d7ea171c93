"""``validation_split``: the last part of the training samples held out as the evaluation set.

Keras's rule (``model.fit(x, y, validation_split=0.1)``): training keeps the first
``floor(n * (1 - fraction))`` samples and the rest are the evaluation set, taken before any
shuffling, so the split is the same in every run and every process. Tensors, arrays and dicts of them are sliced (views, no copy);
a ``TensorDataset`` stays one (gathered in memory); any other map-style ``Dataset`` becomes
two ``Subset``s of itself; a ``DataLoader`` two loaders like it (its collate function and
workers kept).

>>> train, held_out = hold_out((X, y), 0.1)      # (X[:900], y[:900]), (X[900:], y[900:]) of 1000
"""
from __future__ import annotations

import math
from typing import Any, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset

from .samplers import picks_of


def check_fraction(value: Any) -> float:
    """A fraction strictly between 0 and 1 (``validation_split``), or a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"validation_split must be a fraction between 0 and 1 (0.1 holds out the last tenth of "
                         f"the training samples), got {value!r}")
    return float(value)


def hold_out(data: Any, fraction: float) -> Tuple[Any, Any]:
    """``(training part, held-out part)`` of ``data``: see the module docstring."""
    n = data_length(data)
    keep = math.floor(round(n * (1.0 - fraction), 9))      # (0.9 of 10 keeps 1, not 0.99999...: 0)
    if keep < 1 or keep >= n:
        raise ValueError(f"validation_split={fraction:g} of {n} training samples leaves "
                         f"{'no training' if keep < 1 else 'no evaluation'} sample: give a fraction that keeps "
                         f"at least one on each side, or eval_data")
    return _part(data, 0, keep), _part(data, keep, n)


def data_length(data: Any, asking: str = "validation_split") -> int:
    """The samples of ``data`` (tensors, a dict of them, a map-style ``Dataset``, a ``DataLoader``'s),
    or an error naming why they cannot be counted for what is ``asking``."""
    if isinstance(data, DataLoader):
        if not isinstance(data.dataset, IterableDataset) and any(p is not None for p in picks_of(data)):
            picks = next(p for p in picks_of(data) if p is not None)
            raise ValueError(f"{asking} with the DataLoader's {type(picks).__name__}: its indices "
                             f"cover the whole dataset, not a held-out part: give eval_data")
        data = data.dataset
    if isinstance(data, IterableDataset):
        raise ValueError(f"{asking} needs a map-style Dataset (with __len__ and __getitem__); an "
                         f"IterableDataset has no last samples to hold out: give eval_data")
    if isinstance(data, (tuple, list)) and data and all(_is_array(t) for t in data):
        return _same_length([len(t) for t in data], "the tensors", asking)
    if isinstance(data, dict) and data and all(_is_array(t) for t in data.values()):
        return _same_length([len(t) for t in data.values()], "the dict's tensors", asking)
    if _is_array(data) or hasattr(data, "__len__"):
        return len(data)
    raise TypeError(f"{asking} cannot count the samples of {type(data).__name__}: give a Dataset, tensors (X, y) or "
                    f"a dict of tensors{', or eval_data' if asking == 'validation_split' else ''}")


def _part(data: Any, start: int, stop: int) -> Any:
    if isinstance(data, DataLoader):
        return DataLoader(_part(data.dataset, start, stop), batch_size=data.batch_size, collate_fn=data.collate_fn,
                          num_workers=data.num_workers)
    if isinstance(data, TensorDataset):
        return TensorDataset(*(t[start:stop] for t in data.tensors))
    if _is_array(data):
        return data[start:stop]
    if isinstance(data, (tuple, list)) and all(_is_array(t) for t in data):
        return type(data)(t[start:stop] for t in data)
    if isinstance(data, dict):
        return {k: t[start:stop] for k, t in data.items()}
    return Subset(data, range(start, stop))


def _is_array(x: Any) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray))


def _same_length(lengths: list, what: str, asking: str) -> int:
    if len(set(lengths)) != 1:
        raise ValueError(f"{asking}: {what} have different lengths {lengths}: every one needs one row per "
                         f"sample")
    return lengths[0]
