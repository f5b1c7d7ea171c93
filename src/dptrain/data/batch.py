"""Batches of any structure: a tensor, a tuple or list, or a dict of them, split along axis 0.

A batch is what a loader yields: ``X``, ``(X, y)``, ``(X, mask, y)`` or
``{"image": X, "label": y}``, or a dataclass instance (``Batch(x=..., y=...)``, a
``collate_fn``'s), nested as deep as needed. Every tensor in it holds the same number of
samples along its first axis; lists of per-sample items (strings, say) of that length are
split like tensors, other values are given whole to every shard.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping      # (typing's Mapping: isinstance 2.5x slower, every batch)
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import torch

from .batch_objects import PackedSequence, cannot_cut, declared_size, own_object, unsized

Batch = Any


def map_tensors(fn: Callable[[torch.Tensor], Any], batch: Batch,
                objects: Optional[Callable[[Any], Any]] = None) -> Batch:
    """Apply ``fn`` to every tensor of ``batch``, keeping its structure (``objects``: to each batch
    object of one's own too, ``batch_objects.py``; other values stay as they are)."""
    kind = type(batch)
    if kind is tuple or kind is list:       # the usual batches, first: this runs every step
        return kind([fn(v) if type(v) is torch.Tensor else map_tensors(fn, v, objects) for v in batch])
    if kind is dict:
        return {k: fn(v) if type(v) is torch.Tensor else map_tensors(fn, v, objects) for k, v in batch.items()}
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return _like(batch, {k: map_tensors(fn, v, objects) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):          # a namedtuple
        if kind is PackedSequence:      # (its fields are not cut alike: one object)
            return objects(batch) if objects is not None else batch
        return type(batch)(*(map_tensors(fn, v, objects) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(fn, v, objects) for v in batch)
    if _is_dataclass(batch):
        return _with_fields(batch, [map_tensors(fn, getattr(batch, f.name), objects)
                                    for f in dataclasses.fields(batch)])
    return objects(batch) if objects is not None and own_object(batch) else batch


def _like(mapping: Mapping, items: dict) -> Mapping:
    """``items`` as ``mapping``'s type where it is built from a dict (a ``UserDict``, an
    ``OrderedDict``, Hugging Face's ``BatchEncoding``, whose ``batch.input_ids`` the user's
    forward may read), else the dict itself."""
    kind = type(mapping)
    if kind is dict:
        return items
    try:
        return kind(items)
    except Exception:       # noqa: BLE001 - a constructor that takes no dict: a plain dict
        return items


def _is_dataclass(value: Any) -> bool:
    """A dataclass instance (not the class itself)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _with_fields(value: Any, new: Sequence[Any]) -> Any:
    """A copy of the dataclass instance ``value`` with its fields set to ``new`` (in order):
    no ``__init__`` or ``__post_init__`` runs again, frozen ones too."""
    out = copy.copy(value)
    for f, v in zip(dataclasses.fields(value), new):
        object.__setattr__(out, f.name, v)
    return out


def as_tensors(batch: Batch) -> Batch:
    """NumPy arrays become tensors (sharing memory); everything else is kept."""
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch)
    if isinstance(batch, Mapping):
        return _like(batch, {k: as_tensors(v) for k, v in batch.items()})
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        return type(batch)(as_tensors(v) for v in batch)
    if _is_dataclass(batch):
        return _with_fields(batch, [as_tensors(getattr(batch, f.name)) for f in dataclasses.fields(batch)])
    return batch


def tensors_of(batch: Batch) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    map_tensors(out.append, batch)
    return out


class Samples(tuple):
    """Items of a batch kept one per sample, each whole: images of their own sizes, a dict of
    boxes per image (a detection model's batch). A device's part of the batch takes some of
    them, never a slice of one; the batch's samples are their number. ``collate_samples``
    makes them, as torchvision's ``tuple(zip(*batch))`` does, marked.

    >>> images, targets = collate_samples([(img0, t0), (img1, t1), (img2, t2)])
    >>> len(images), batch_size((images, targets))             # 3, 3
    """


def collate_samples(samples: Sequence[Any]) -> Any:
    """A ``collate_fn`` for samples that do not stack (detection's ``(image, target)`` pairs):
    each field as ``Samples``, one item per sample, in order (a sample that is not a tuple or
    list: the ``Samples`` of them)."""
    if samples and isinstance(samples[0], (tuple, list)):
        return tuple(Samples(field) for field in zip(*samples))
    return Samples(samples)


def _first_axes(x: Any, out: List[Optional[int]]) -> None:
    """Append each tensor's first axis (None for a 0-d one), and each ``Samples``' length."""
    kind = type(x)
    if kind is torch.Tensor:
        out.append(x.shape[0] if x.dim() else None)
    elif kind is tuple or kind is list:
        for v in x:
            _first_axes(v, out)
    elif kind is dict:
        for v in x.values():
            _first_axes(v, out)
    elif kind is Samples:
        out.append(len(x))
    elif isinstance(x, torch.Tensor):
        out.append(x.shape[0] if x.dim() else None)
    elif isinstance(x, Mapping):
        for v in x.values():
            _first_axes(v, out)
    elif own_object(x):             # (PyG's Batch: its batch_size; a PackedSequence, a namedtuple: its sequences)
        size = declared_size(x)
        if size is not None:
            out.append(size)
    elif isinstance(x, (tuple, list)):
        for v in x:
            _first_axes(v, out)
    elif _is_dataclass(x):
        for f in dataclasses.fields(x):
            _first_axes(getattr(x, f.name), out)


def batch_size(batch: Batch) -> int:
    """The number of samples in ``batch``: the first axis of its tensors (and the length of
    its ``Samples``), which must agree."""
    axes: List[Optional[int]] = []
    _first_axes(batch, axes)
    if not axes:
        raise TypeError(unsized(batch) if own_object(batch) else
                        f"a batch must hold at least one tensor, got {type(batch).__name__}")
    sizes = set(axes)
    if None in sizes:
        raise ValueError("a batch tensor has no batch axis (a 0-d tensor): every tensor needs the samples "
                         "along its first axis")
    if len(sizes) > 1:
        raise ValueError(f"the tensors of a batch hold different numbers of samples {sorted(sizes)}: every "
                         f"tensor needs the samples along its first axis (a collate_fn padding sequences with "
                         f"pad_sequence needs batch_first=True; a sequence-first model transposes in its forward; "
                         f"items that do not stack, images of several sizes or a dict of boxes per image, are "
                         f"kept one per sample by collate_fn=dptrain.data.collate_samples)")
    return sizes.pop()


def split_structure(batch: Batch, sizes: Sequence[int]) -> List[Batch]:
    """Cut ``batch`` into consecutive parts of ``sizes`` samples, keeping its structure."""
    n = sum(sizes)

    def cut(x: Any) -> List[Any]:
        if isinstance(x, torch.Tensor):
            return list(torch.split(x, list(sizes)))
        if type(x) is Samples:
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            return [Samples(x[a:a + k]) for a, k in zip(starts, sizes)]
        if own_object(x):
            raise cannot_cut(x)
        if isinstance(x, Mapping):
            parts = {k: cut(v) for k, v in x.items()}
            return [_like(x, {k: parts[k][i] for k in parts}) for i in range(len(sizes))]
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            parts = [cut(v) for v in x]
            return [type(x)(*(p[i] for p in parts)) for i in range(len(sizes))]
        if isinstance(x, (tuple, list)):
            if len(x) == n and x and not any(isinstance(v, (torch.Tensor, Mapping, tuple, list)) for v in x):
                out, start = [], 0             # a list of per-sample items (strings...)
                for s in sizes:
                    out.append(type(x)(x[start:start + s]))
                    start += s
                return out
            parts = [cut(v) for v in x]
            return [type(x)(p[i] for p in parts) for i in range(len(sizes))]
        if _is_dataclass(x):
            parts = [cut(getattr(x, f.name)) for f in dataclasses.fields(x)]
            return [_with_fields(x, [p[i] for p in parts]) for i in range(len(sizes))]
        return [x] * len(sizes)
    return cut(batch)


def join_structure(parts: Sequence[Batch]) -> Batch:
    """Join consecutive parts along the first axis, keeping their structure: the inverse of
    ``split_structure`` (a model's outputs, part by part). None stays None (a Hugging Face
    output's ``loss`` without labels); lists of per-sample items (strings, a dict per sample
    as a detection model gives, or lists whose lengths differ) are joined; another value the
    parts share is kept; a ``TypeError`` names one that differs (a number per part) and a 0-dim
    tensor (a loss of the part)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            raise TypeError("cannot join 0-dim tensors sample by sample (one number for a whole part of the batch, "
                            "such as an auxiliary loss beside the outputs)")
        return torch.cat(list(parts))
    if first is None:
        return None
    if type(first) is Samples:
        return Samples(v for p in parts for v in p)
    if isinstance(first, Mapping):
        return _like(first, {k: join_structure([p[k] for p in parts]) for k in first})
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(join_structure([p[i] for p in parts]) for i in range(len(first))))
    if _is_dataclass(first):
        return _with_fields(first, [join_structure([getattr(p, f.name) for p in parts])
                                    for f in dataclasses.fields(first)])
    if isinstance(first, (tuple, list)):
        if len({len(p) for p in parts}) > 1 or (first and (
                not any(isinstance(v, (torch.Tensor, Mapping, tuple, list)) or v is None for v in first)
                or type(first) is list and all(isinstance(v, Mapping) for p in parts for v in p))):
            # per-sample items: strings, or a dict per sample (a detection model's boxes per image)
            return type(first)(v for p in parts for v in p)
        return type(first)(join_structure([p[i] for p in parts]) for i in range(len(first)))
    try:
        same = all(p is first or bool(p == first) for p in parts[1:])
    except Exception:       # noqa: BLE001 - a comparison that gives no answer: not the same
        same = False
    if same:                # a value split_structure gave whole to every part
        return first
    raise TypeError(f"cannot join values of type {type(first).__name__} sample by sample: give tensors, or "
                    f"tuples, lists, dicts or dataclasses of them")


def to_device(batch: Batch, device: torch.device, memory_format: Optional[torch.memory_format] = None) -> Batch:
    """Move every tensor to ``device``; virtual CPU devices share host memory (no copy).

    ``memory_format``: 4-d float tensors (images) take it (channels_last, say)."""
    on_host = device.type == "cpu"
    if on_host and memory_format is None:     # a loader's batch on a CPU device: nothing to do, nothing rebuilt
        kind = type(batch)     # (a dict of 3 tensors: 0.5 us to check, 2.4 us to rebuild; in a step 3-10x that)
        flat = batch.values() if kind is dict else batch if kind is tuple or kind is list else None
        if flat is not None and all(type(t) is torch.Tensor and t.is_cpu for t in flat):
            return batch

    def move(t: torch.Tensor) -> torch.Tensor:
        if not (on_host and t.device.type == "cpu"):
            t = t.to(device, non_blocking=True)
        if memory_format is not None and t.dim() == 4 and t.is_floating_point():
            t = t.contiguous(memory_format=memory_format)
        return t
    return map_tensors(move, batch, lambda o: o.to(device))


def needs_move(batch: Batch, device: torch.device, memory_format: Optional[torch.memory_format] = None) -> bool:
    """Whether ``to_device`` has anything to do for batches like ``batch``: nothing for a CPU
    device without a memory format when the batch's tensors are on the CPU, as a loader's
    are. A loop over alike batches asks once and skips the call (it cost 8-11 us a batch of
    the text classifier's evaluation, session 16)."""
    return device.type != "cpu" or memory_format is not None or not all(t.is_cpu for t in tensors_of(batch))


def holds_images(batch: Batch) -> bool:
    """Whether the batch's first tensor is a stack of images (N, C, H, W): what a speed is
    counted in (images or samples)."""
    tensors = tensors_of(batch)
    return bool(tensors) and tensors[0].dim() == 4
