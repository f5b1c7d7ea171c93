"""Collectives across processes, with a do-nothing version for one process.

The training code calls these unconditionally: with one process they return their input,
so it has no ``if distributed:`` branches.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch
import torch.distributed as dist

from .exchange import ExchangeWork, gather_objects, scatter_objects, worth_exchanging
from .join import join_from_environment


class _Done:
    def wait(self) -> bool:
        return True


class Collective:
    """One process: every collective is the identity."""
    rank, world_size = 0, 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over processes, in place; return it."""
        return tensor

    def all_reduce_async(self, tensor: torch.Tensor) -> Any:
        """Start summing ``tensor`` (on the communication device) over processes; ``.wait()`` ends it."""
        return _Done()

    def all_gather(self, tensor: torch.Tensor) -> List[torch.Tensor]:
        return [tensor]

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every process's ``obj`` (picklable), in rank order."""
        return [obj]

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Give every process rank ``src``'s values, packed into one message."""

    def scatter_object(self, objs: Any, src: int = 0) -> Any:
        """Rank ``src`` gives rank ``r`` its ``objs[r]`` (picklable; other ranks pass None)."""
        return objs[src]



class TorchCollective(Collective):
    """A process group of ``torch.distributed`` (the default one unless ``group`` is given)."""

    def __init__(self, group=None):
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        backend = dist.get_backend(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.gloo = backend == "gloo"    # small tensors: summed by exchange.py

    def _exchanging(self, tensor: torch.Tensor) -> bool:
        return self.gloo and worth_exchanging(tensor, self.world_size)

    def _on(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        t = self._on(tensor)
        if self._exchanging(t):
            ExchangeWork(t, self.group).wait()
        else:
            dist.all_reduce(t, group=self.group)
        if t is not tensor:
            tensor.copy_(t)
        return tensor

    def all_reduce_async(self, tensor: torch.Tensor):
        if self._exchanging(tensor):
            return ExchangeWork(tensor, self.group)
        return dist.all_reduce(tensor, group=self.group, async_op=True)

    def all_gather(self, tensor: torch.Tensor) -> List[torch.Tensor]:
        t = self._on(tensor.contiguous())
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.group)
        return [o.to(tensor.device) for o in out]

    def all_gather_object(self, obj: Any) -> List[Any]:
        if self.gloo:       # point to point: see exchange.gather_objects (an abort at exit)
            return gather_objects(obj, self.group)
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def scatter_object(self, objs: Any, src: int = 0) -> Any:
        if self.gloo:       # point to point, as all_gather_object (exchange.gather_objects)
            return scatter_objects(objs, src, self.group)
        out: List[Any] = [None]
        dist.scatter_object_list(out, objs if self.rank == src else None, src=src, group=self.group)
        return out[0]

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for group in by_dtype.values():          # one message per dtype, values kept exact
            flat = torch.cat([self._on(t.detach()).reshape(-1) for t in group])
            dist.broadcast(flat, src, group=self.group)
            offset = 0
            with torch.no_grad():
                for t in group:
                    n = t.numel()
                    t.copy_(flat[offset:offset + n].view_as(t))
                    offset += n


def get_collective(new_group: bool = False) -> Collective:
    """The collective for this process: torch.distributed's if initialised, else the identity.

    Under torchrun (``WORLD_SIZE`` > 1 in the environment) a process that has not joined the
    process group joins it here, so a Trainer never trains the ranks independently.
    ``new_group=True`` gives a collective on a process group of its own (every process must
    ask at the same point), for traffic that may run at the same time as the gradients'.
    """
    if dist.is_available() and not dist.is_initialized():
        join_from_environment()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchCollective(dist.new_group() if new_group else None)
    return Collective()
