"""A batch object of one's own: a class a ``collate_fn`` returns that holds the batch's tensors
and moves them itself, ``batch.to(device)`` (PyTorch Geometric's ``Batch`` of graphs, whose
tensors have no common first axis: nodes, edges, one row per graph).

dptrain cannot cut such an object into parts of the batch, so it trains on one device a process
(``devices=1``; several processes each collate their own part, as a DDP script's loader does).
It moves it with its own ``to``, and counts its samples by what it says: a ``batch_size`` or
``num_graphs`` attribute (PyG's ``Batch`` has both), else ``len()``. torch's ``PackedSequence``
(a ``collate_fn``'s ``pack_sequence``) is one too, though a namedtuple: its fields are not cut
alike; its samples are its sequences.

    class GraphBatch:
        def __init__(self, x, edge_index, batch, y): ...
        batch_size = property(lambda self: len(self.y))
        def to(self, device): return GraphBatch(self.x.to(device), ...)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence
from torch.utils.data._utils.collate import default_collate

_CONTAINERS = (torch.Tensor, Mapping, tuple, list, str, bytes, np.ndarray, torch.nn.Module)


def own_object(x: Any) -> bool:
    """Whether ``x`` is a batch object of one's own: it has a ``to`` method and is none of the
    structures dptrain reads (tensors, mappings, sequences, dataclasses) nor a module; or a
    ``PackedSequence``."""
    if type(x) is PackedSequence:
        return True
    return callable(getattr(x, "to", None)) and not isinstance(x, _CONTAINERS) and not isinstance(x, type) \
        and not dataclasses.is_dataclass(x)


def declared_size(x: Any) -> Optional[int]:
    """The samples an object of one's own says it holds (``batch_size``, ``num_graphs``, then
    ``len``), or None where it says none."""
    if type(x) is PackedSequence:
        return int(x.batch_sizes[0]) if len(x.batch_sizes) else 0
    for name in ("batch_size", "num_graphs"):
        value = getattr(x, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    try:
        return len(x)
    except TypeError:
        return None


def unsized(x: Any) -> str:
    """The error's text for a batch object that says nothing of its samples."""
    name = type(x).__name__
    return (f"a batch must hold at least one tensor, got {name}, which does not say how many samples it holds: give "
            f"{name} a batch_size attribute (its number of samples, as PyTorch Geometric's Batch has), or __len__")


def cannot_cut(x: Any) -> TypeError:
    """The error for a batch object cut into parts (several devices of a process)."""
    name = type(x).__name__
    return TypeError(f"a batch holding a {name} (one object, whose tensors share no first axis) cannot be cut into "
                     f"parts of the batch, one per device: train on one device a process (devices=1; dptrain launch "
                     f"--processes N, where each process collates its own part), or let each device collate its own "
                     f"part: collate_fn=dptrain.data.collate_samples keeps the samples whole, and "
                     f"forward=lambda model, batch: ... builds the {name} of each device's part")


def collate_default(samples: Any) -> Any:
    """torch's ``default_collate``, whose error for samples that are objects of one's own (PyG's
    ``Data``: a graph a sample) names the fix, a ``collate_fn`` that makes their batch object
    (it was torch's "default_collate: batch must contain tensors...")."""
    try:
        return default_collate(samples)
    except TypeError:
        first = samples[0] if isinstance(samples, (list, tuple)) and samples else None
        if first is None or not own_object(first):
            raise
    name = type(first).__name__
    pyg = type(first).__module__.startswith("torch_geometric")
    raise TypeError(f"samples of type {name} (an object of your own, with its own to) cannot be stacked into a batch "
                    f"by torch's default_collate: pass collate_fn=fn(list of samples) -> batch"
                    + (", here collate_fn=torch_geometric.data.Batch.from_data_list (or give a "
                       "torch_geometric.loader.DataLoader)" if pyg else
                       f" (e.g. a batch object of its {name}s, with a to and a batch_size)")) from None
