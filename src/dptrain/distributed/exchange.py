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

``gather_objects`` gathers every process's object the same way, point to point (see there:
an abort at exit that torch's ``all_gather_object`` caused).
"""
from __future__ import annotations

import pickle
from typing import Any, List

import torch
import torch.distributed as dist

#: (processes - 1) x tensor bytes up to which gloo sums by exchange.
MAX_BYTES = 1 << 20
#: the point-to-point tag of the exchange's messages (they match in order per peer and tag).
TAG = 7919
#: ... and of ``gather_objects``'s.
GATHER_TAG = 7920
SCATTER_TAG = 7921


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


def gather_objects(obj: Any, group=None) -> List[Any]:
    """Every process's ``obj`` (picklable), in rank order, sent point to point (gloo).

    Why not ``dist.all_gather_object``: its all_gathers run on the process group's worker
    threads, which drop their references to the gathered tensors (its temporaries, which
    Python has already let go) a moment after the caller sees them done. A script whose last
    collective it was could then exit first: the worker thread, freeing a tensor's Python
    object, asked a finalizing interpreter for the GIL and the process died "terminate called
    without an active exception" (SIGABRT; a core showed ``~AsyncAllgatherWork`` in
    ``ProcessGroupGloo::runLoop``). ``fit`` then ``predict`` under ``dptrain launch`` aborted 5
    runs in 29 (session 18). Here every message's work belongs to this thread, which waits for
    it and frees it: the same exit ran clean."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    sizes = _gathered(torch.tensor([payload.numel()], dtype=torch.long), [1] * world, rank, group)
    parts = _gathered(payload, [int(n) for n in torch.cat(sizes).tolist()], rank, group)
    return [pickle.loads(part.numpy().tobytes()) for part in parts]


def _gathered(tensor: torch.Tensor, sizes: List[int], rank: int, group) -> List[torch.Tensor]:
    """Every process's 1-D ``tensor`` (``sizes[r]`` elements on rank ``r``), in rank order."""
    parts = [tensor if r == rank else torch.empty(sizes[r], dtype=tensor.dtype) for r in range(len(sizes))]
    requests = []
    for r in range(len(sizes)):
        if r != rank:
            peer = r if group is None else dist.get_global_rank(group, r)
            requests.append(dist.isend(tensor, peer, group=group, tag=GATHER_TAG))
            requests.append(dist.irecv(parts[r], peer, group=group, tag=GATHER_TAG))
    for request in requests:
        request.wait()
    return parts


def scatter_objects(objs: Any, src: int = 0, group=None) -> Any:
    """Rank ``src`` gives rank ``r`` its ``objs[r]`` (picklable; the others pass None); every
    process returns its own, sent point to point as ``gather_objects`` sends (gloo), each
    message's size first."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    if rank != src:
        size = torch.empty(1, dtype=torch.long)
        dist.recv(size, peer(src), group=group, tag=SCATTER_TAG)
        payload = torch.empty(int(size), dtype=torch.uint8)
        dist.recv(payload, peer(src), group=group, tag=SCATTER_TAG)
        return pickle.loads(payload.numpy().tobytes())
    requests, kept = [], []
    for r in range(world):
        if r != src:
            payload = torch.frombuffer(bytearray(pickle.dumps(objs[r], protocol=pickle.HIGHEST_PROTOCOL)),
                                       dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.long)
            kept += [size, payload]
            requests.append(dist.isend(size, peer(r), group=group, tag=SCATTER_TAG))
            requests.append(dist.isend(payload, peer(r), group=group, tag=SCATTER_TAG))
    for request in requests:
        request.wait()
    return objs[src]
