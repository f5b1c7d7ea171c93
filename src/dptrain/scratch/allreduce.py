"""Allreduce written from scratch: sum same-shaped tensors living on different devices.

Both algorithms work in place, so every tensor ends holding the sum. They are the spec the
engine's collectives are tested against (``torch.distributed.all_reduce``).

- ``naive``: reduce everything onto the first device, then broadcast it back. The first
  device moves ``2(N-1)`` full tensors, so its link is the bottleneck.
- ``ring``: reduce-scatter then all-gather around the ring ``0 -> 1 -> ... -> N-1 -> 0``,
  ``N-1`` steps each. Every device sends and receives ``2(N-1)/N`` of a tensor in total,
  whatever N, which is why NCCL uses it for large tensors.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import torch

ALGORITHMS = ("naive", "ring")


def _check(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("allreduce needs at least one tensor, got an empty list")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"allreduce needs tensors, got {type(t).__name__}")
        if t.is_meta:
            raise ValueError("allreduce needs tensors that hold data, got a meta tensor: materialise it first "
                             "(e.g. torch.empty_like(t, device='cpu'))")
        if t.requires_grad and t.is_leaf and torch.is_grad_enabled():
            raise ValueError("allreduce sums in place, and a leaf tensor that requires grad cannot change in place: "
                             "pass the gradients (p.grad), or call it under torch.no_grad()")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], 1):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(
                f"allreduce needs tensors of one shape and dtype: tensor 0 is "
                f"{tuple(first.shape)} {first.dtype}, tensor {i} is {tuple(t.shape)} {t.dtype}")
    return tensors


def allreduce_naive(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Sum onto ``tensors[0]``, then copy the sum back to every other tensor."""
    tensors = _check(tensors)
    root = tensors[0]
    for t in tensors[1:]:
        root.add_(t.to(root.device, non_blocking=True))
    for t in tensors[1:]:
        t.copy_(root, non_blocking=True)
    return tensors


def allreduce_ring(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Reduce-scatter then all-gather around a ring; any size, divisible by N or not.

    Each tensor is cut into N chunks (sizes differ by at most one; some may be empty when the
    tensor has fewer than N elements). In reduce-scatter step ``s`` device ``i`` sends chunk
    ``(i - s) mod N`` to device ``i + 1``, which adds it to its own; after ``N-1`` steps device
    ``i`` holds the full sum of chunk ``(i + 1) mod N``. All-gather passes those finished
    chunks on around the ring for another ``N-1`` steps. Within a step every device receives
    a different chunk from the one it sends, so doing a step's transfers one after another
    here gives the same result as doing them at once.
    """
    tensors = _check(tensors)
    n = len(tensors)
    if n == 1:
        return tensors
    flats = [t.view(-1) if t.is_contiguous() else t.reshape(-1).clone() for t in tensors]
    chunks = [torch.tensor_split(f, n) for f in flats]
    for s in range(n - 1):                      # reduce-scatter
        for i in range(n):
            c, dst = (i - s) % n, (i + 1) % n
            chunks[dst][c].add_(chunks[i][c].to(flats[dst].device, non_blocking=True))
    for s in range(n - 1):                      # all-gather
        for i in range(n):
            c, dst = (i + 1 - s) % n, (i + 1) % n
            chunks[dst][c].copy_(chunks[i][c], non_blocking=True)
    for t, f in zip(tensors, flats):
        if not t.is_contiguous():
            t.copy_(f.view_as(t))
    return tensors


_IMPLS: Dict[str, Callable[[Sequence[torch.Tensor]], List[torch.Tensor]]] = {
    "naive": allreduce_naive, "ring": allreduce_ring}


def allreduce(tensors: Sequence[torch.Tensor], algorithm: str = "naive") -> List[torch.Tensor]:
    """Sum a list of same-shaped tensors in place, so every tensor ends with the sum.

    >>> a, b = torch.ones(2), torch.full((2,), 2.0)     # a on cpu:0, b on cpu:1
    >>> allreduce([a, b], algorithm="ring")
    [tensor([3., 3.]), tensor([3., 3.])]
    """
    impl = _IMPLS.get(algorithm)
    if impl is None:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return impl(tensors)
