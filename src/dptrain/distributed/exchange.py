"""Sum a small tensor over the processes by direct exchange: each process sends its tensor to
every other one (``isend``/``irecv``) and adds what it receives, in rank order.

Why not gloo's ``all_reduce``: it hands the work to the process group's worker thread and
goes round a ring, more wake-ups per call, and a small tensor is all latency. Measured on
this project's 2-core machine (``benchmarks/bench_exchange.py``: 2 processes on loopback, each
call after 5 ms of compute on both): with a busy neighbour on rank 1's core, LeNet's 235 KB of
gradients took 10.9 ms by gloo's all_reduce and 2.9 ms by exchange (1 KB to 1 MiB: 2.7-3.8x);
on quiet cores both took 2.9 ms; at 4 MiB the exchange lost on quiet cores (0.64x). With W
processes it sends W - 1 copies of the tensor where a ring sends 2(W - 1)/W of one. So gloo
(CPU tensors) sums by exchange up to ``MAX_BYTES`` of ``(W - 1) x size``, by ring above.
In training (``benchmarks/bench_balance.py``, LeNet, 2 processes, busy neighbour) it raised
the images/s by 12-13%.

Every process adds the same numbers in the same order (rank 0's + rank 1's, then rank 2's,
...), so all end with the same bits, as replicas must; with 2 processes they are the bits
of gloo's all_reduce (a + b == b + a exactly).
"""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist

#: (processes - 1) x tensor bytes up to which gloo sums by exchange.
MAX_BYTES = 1 << 20
#: the point-to-point tag of the exchange's messages (they match in order per peer and tag).
TAG = 7919


def worth_exchanging(tensor: torch.Tensor, world_size: int) -> bool:
    """Whether a gloo process group should sum ``tensor`` by exchange rather than by ring."""
    return (world_size > 1 and tensor.device.type == "cpu" and tensor.is_contiguous()
            and (world_size - 1) * tensor.numel() * tensor.element_size() <= MAX_BYTES)


class ExchangeWork:
    """The exchange, started: ``wait()`` leaves the sum in the tensor (as ``all_reduce``'s
    work does). The tensor must not change until then: it is being sent."""

    def __init__(self, tensor: torch.Tensor, group=None):
        self.tensor, self.rank = tensor, dist.get_rank(group)
        world = dist.get_world_size(group)
        self.parts: List[torch.Tensor] = [tensor if r == self.rank else torch.empty_like(tensor)
                                          for r in range(world)]
        self.requests = []
        for r in range(world):
            if r != self.rank:
                peer = r if group is None else dist.get_global_rank(group, r)
                self.requests.append(dist.isend(tensor, peer, group=group, tag=TAG))
                self.requests.append(dist.irecv(self.parts[r], peer, group=group, tag=TAG))
        self.done = False

    def wait(self) -> bool:
        if self.done:
            return True
        for request in self.requests:
            request.wait()
        parts = self.parts
        if self.rank == 1:       # a + b == b + a: rank 1, like rank 0, adds into its own tensor
            parts = [parts[1], parts[0]] + parts[2:]
        total = parts[0]
        for part in parts[1:]:
            total.add_(part)
        if total is not self.tensor:
            self.tensor.copy_(total)
        self.requests, self.parts, self.done = [], [], True
        return True
