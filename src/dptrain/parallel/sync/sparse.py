"""Sparse gradients over processes: an ``nn.Embedding(sparse=True)``'s (or ``EmbeddingBag``'s)
gradient is a sparse COO tensor holding only the rows the batch looked up, and its optimizer
may take nothing else (``torch.optim.SparseAdam``). Packed into a dense bucket it would be
densified (and SparseAdam refuses it); so such a parameter stays out of the buckets and its
gradient is summed here, as DDP sums one: the union of every process's rows, each row's
values added (a row looked up on one process only is still a row of the sum, as on one
device with the whole batch).

Every process gathers every process's indices and values (padded to the longest, then cut
back), in rank order, and builds the same coalesced sum; three small collectives per sparse
parameter, whatever the backend (NCCL has no sparse all_reduce).

>>> total = sum_sparse(collective, grad_or_none, weight, device)    # None if no process had one
"""
from __future__ import annotations

from typing import Collection, List, Optional

import torch
from torch import nn

from ...distributed.collective import Collective


def sparse_parameters(module: nn.Module, params: List[torch.Tensor]) -> List[int]:
    """Indices into ``params`` of the weights whose gradients are sparse: those of the
    ``Embedding`` and ``EmbeddingBag`` layers of ``module`` made with ``sparse=True``."""
    sparse = {id(m.weight) for m in module.modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
    return [j for j, p in enumerate(params) if id(p) in sparse]


def local_sum(grads: Collection[Optional[torch.Tensor]], device: torch.device) -> Optional[torch.Tensor]:
    """The sum of this process's replicas' gradients of one parameter on ``device`` (None: none had one)."""
    total = None
    for grad in grads:
        if grad is not None:
            grad = grad.to(device)
            total = grad if total is None else total + grad
    return total


def sum_sparse(collective: Collective, grad: Optional[torch.Tensor], like: torch.Tensor,
               device: torch.device) -> Optional[torch.Tensor]:
    """The sum over the processes of ``grad`` (this process's gradient of parameter ``like``,
    on ``device``: sparse, or dense if a layer gave one, or None), coalesced, on ``device``;
    None if no process had one. (``like`` gives the shape and dtype; it is not copied.)"""
    if grad is not None:
        grad = (grad if grad.is_sparse else grad.to_sparse(1)).coalesce()
    nnz = 0 if grad is None else grad._nnz()
    heads = collective.all_gather(torch.tensor([nnz, int(grad is not None)], dtype=torch.long, device=device))
    counts = [int(h[0]) for h in heads]
    if not any(int(h[1]) for h in heads):
        return None
    most = max(counts)
    indices = torch.zeros(1, most, dtype=torch.long, device=device)
    values = torch.zeros((most,) + tuple(like.shape[1:]), dtype=like.dtype, device=device)
    if nnz:
        indices[:, :nnz] = grad.indices()
        values[:nnz] = grad.values().to(like.dtype)
    every_index = collective.all_gather(indices) if most else [indices] * len(counts)
    every_value = collective.all_gather(values) if most else [values] * len(counts)
    index = torch.cat([i[:, :n] for i, n in zip(every_index, counts)], 1)
    value = torch.cat([v[:n] for v, n in zip(every_value, counts)], 0)
    return torch.sparse_coo_tensor(index, value, like.shape, device=device, check_invariants=False).coalesce()
