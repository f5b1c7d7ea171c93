"""Float64 data for a float32 model: the fix in the error, not a cast behind the user's back.

NumPy's arrays (and pandas' ``.values``) are float64; a model's parameters are float32. Keras
casts its inputs to the layer's dtype; torch refuses to mix them deep in the first forward
("mat1 and mat2 must have the same dtype, but got Double and Float"). dptrain casts nothing (a
model may read float64 inputs on purpose, timestamps say, and cast them itself), but when such
an error leaves ``fit``, ``evaluate`` or ``predict`` while the data given holds float64 arrays
(or is a Dataset holding some, or whose first sample has some) and the model float32 parameters, it is raised again as a
``TypeError`` naming the arrays and both fixes, the user's own error chained (its frames kept)::

    with float64_named(model, train_data, eval_data):
        ...
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, List

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

# the words of torch's errors for two dtypes meeting (matmul, conv, the losses' backward)
_WORDS = ("double", "float64")


@contextmanager
def float64_named(model: nn.Module, *data: Any) -> Iterator[None]:
    try:
        yield
    except RuntimeError as e:
        text = str(e).lower()
        names = float64_arrays(data) if any(w in text for w in _WORDS) and _float32(model) else []
        if not names:
            raise
        raise TypeError(f"{e}: the data's {', '.join(names)} {'is' if len(names) == 1 else 'are'} float64 "
                        f"(NumPy's default) and the model's parameters float32: give float32 data "
                        f"(X.astype(np.float32), or tensor.float()), or train in float64 (model.double())") from e


def float64_arrays(data: Any) -> List[str]:
    """Names of the float64 arrays given as ``data`` (tensors, NumPy arrays, tuples, dicts
    of them, a ``TensorDataset``, a ``Dataset``'s attributes, a ``DataLoader`` over one), several
    data sets too."""
    found: List[str] = []

    def visit(x: Any, name: str, depth: int) -> None:
        if isinstance(x, (torch.Tensor, np.ndarray)):
            if x.dtype in (torch.float64, np.float64):
                found.append(name or "X")
        elif depth > 2:
            return
        elif isinstance(x, DataLoader):
            visit(x.dataset, name, depth + 1)
        elif isinstance(x, TensorDataset):
            visit(tuple(x.tensors), name, depth + 1)
        elif isinstance(x, Dataset):        # one of the user's own: the arrays it holds (self.X = X)
            before = len(found)
            for k, v in vars(x).items():
                if not k.startswith("_"):
                    visit(v, f"{type(x).__name__}.{k}", depth + 1)
            if len(found) == before and not isinstance(x, IterableDataset):
                try:                        # else its first sample (read once, the run having failed)
                    sample = x[0]
                except Exception:
                    return
                visit(sample, f"{type(x).__name__}[0]", depth + 1)
        elif isinstance(x, dict):
            for k, v in x.items():
                visit(v, f"{name}[{k!r}]" if name else repr(k), depth + 1)
        elif isinstance(x, (tuple, list)) and len(x) <= 16:
            for i, v in enumerate(x):
                visit(v, f"{name}[{i}]" if name else ("X", "y")[i] if len(x) == 2 else f"[{i}]", depth + 1)

    for one in data:
        visit(one, "", 0)
    return list(dict.fromkeys(found))


def _float32(model: nn.Module) -> bool:
    return any(p.dtype == torch.float32 for p in model.parameters())
