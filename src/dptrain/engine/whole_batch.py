"""A loss over the whole global batch: ``loss=dptrain.whole_batch(fn)``.

A loss that couples a batch's samples (in-batch negatives: InfoNCE, CLIP's, a triplet loss
mining the batch) is neither a mean nor a sum of per-sample terms, so each device's part
computed alone would see fewer negatives than one device on the whole batch, and N devices
would train differently from one. Wrapped, the loss takes the whole batch on every device:
each device gives the others its part of the outputs and targets (detached) and computes
``fn`` on the whole global batch, its own part live; its gradient is the whole loss's
through its own samples, and the ``Trainer``'s sum over devices and processes is the whole
gradient (``Gathering.shard``). One device of one process calls ``fn`` as it is.

>>> fit(model, pairs, forward=lambda m, b: ((m(b["a"]), m(b["b"])), None), loss=whole_batch(info_nce))
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from ..data.batch import batch_size, join_structure, map_tensors, split_structure, tensors_of
from ..distributed.collective import Collective, get_collective
from ..parallel.syncbn import ThreadGroup

_state = threading.local()
LATE = ("whole_batch: not every device reached the loss in time (each device's loss waits for every device's "
        "part of the batch)")


class WholeBatch:
    """``fn(output, target)`` taken over the whole global batch on any number of devices and
    processes (``whole_batch``); called alone, it is ``fn``."""

    def __init__(self, fn: Callable[[Any, Any], torch.Tensor]):
        if not callable(fn):
            raise TypeError(f"whole_batch takes a loss fn(output, target), got {type(fn).__name__}")
        if isinstance(fn, WholeBatch):
            fn = fn.fn
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, output: Any, target: Any) -> Any:
        gathering = getattr(_state, "gathering", None)
        if gathering is None:
            return self.fn(output, target)
        return gathering.shard(self.fn, output, target)

    def __repr__(self) -> str:
        return f"whole_batch({self.fn!r})"


def whole_batch(fn: Callable[[Any, Any], torch.Tensor]) -> WholeBatch:
    """A loss computed on the whole global batch however it is split: ``loss=whole_batch(fn)``
    for a loss that couples samples (contrastive, in-batch negatives). ``fn(output, target)``
    returns one number, the batch's loss (a mean or anything else); ``target`` may be None."""
    return WholeBatch(fn)


class Gathering:
    """The devices of one process (and, with ``collective``, of every process) exchanging
    their parts of a batch's outputs and targets for a ``WholeBatch`` loss. Each device's
    thread runs its loss ``part(i)`` (its part) or ``idle(i)`` (none this batch)."""

    def __init__(self, devices: Sequence[torch.device], collective: Optional[Collective] = None):
        self.devices = list(devices)
        self.group = ThreadGroup(len(self.devices), collective=collective, late=LATE)
        self.processes = collective is not None and collective.world_size > 1
        self._rank = threading.local()

    @contextmanager
    def part(self, i: int) -> Iterator[None]:
        """Within this block, a ``WholeBatch`` loss on this thread is device ``i``'s part."""
        _state.gathering, self._rank.i = self, i
        try:
            yield
        finally:
            _state.gathering = None

    def guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn(i, ...)`` on device ``i``'s thread, which ends the exchange if it fails (the
        others stop waiting for its part and return; its error is the one raised)."""
        def run(i: int, *args: Any) -> Any:
            try:
                return fn(i, *args)
            except threading.BrokenBarrierError:
                if self.group.aborted:
                    return None
                raise
            except BaseException:
                self.group.abort()
                raise
        return run

    def idle(self, i: int) -> None:
        """Device ``i`` has no part of this batch: it gives none (the others wait for it)."""
        self.group.share(i, None, self._across if self.processes else None)

    def shard(self, fn: Callable[[Any, Any], torch.Tensor], output: Any, target: Any) -> Tuple[torch.Tensor, Any]:
        """``(sum, count)`` of this device's part: ``fn`` on the whole batch ``L``, over ``N``
        samples of which this part holds ``n``: the value ``n * L`` (the parts add up to ``N *
        L``, divided by ``N``), the gradient ``N`` times ``L``'s through this part's samples
        (divided by ``N``, summed over parts: ``L``'s)."""
        i = self._rank.i
        mine = (output, target)
        parts = self.group.share(i, map_tensors(torch.Tensor.detach, mine), self._across if self.processes else None)
        device = next(iter(tensors_of(mine)), torch.empty(0)).device
        own = self._own(i)
        whole = join_structure([mine if j == own else map_tensors(lambda t: t.to(device), p)
                                for j, p in enumerate(parts) if p is not None])
        loss = fn(*whole)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"the whole_batch loss returned {type(loss).__name__}, not one number: return the "
                             f"batch's loss (a mean over its samples, or any one number)")
        loss = loss.reshape(())
        n, total = batch_size(mine), sum(batch_size(p) for p in parts if p is not None)
        return n * loss.detach() + total * (loss - loss.detach()), n

    def _own(self, i: int) -> int:
        """This device's index among every process's devices."""
        return self.group.collective.rank * self.group.size + i if self.processes else i

    def _across(self, local: List[Any]) -> List[Any]:
        """Thread 0: this process's parts -> every process's, in order: a header (each device's
        samples, this process's tensors and bytes a sample), then one message of their bytes,
        padded to the most samples. A process with no sample of the batch takes the others'
        structure, empty."""
        collective, k = self.group.collective, len(local)
        first = self.devices[0]
        given = [map_tensors(lambda t: t.to(first), p) for p in local if p is not None]   # (several GPUs)
        joined = join_structure(given) if given else None
        leaves = tensors_of(joined) if given else []
        sizes = [batch_size(p) if p is not None else 0 for p in local]
        shape = [len(leaves), sum(map(_row_bytes, leaves))] if given else [-1, -1]
        headers = [h.tolist() for h in collective.all_gather(torch.tensor(sizes + shape, dtype=torch.int64))]
        if len({tuple(h[k:]) for h in headers if h[k] >= 0}) > 1:
            raise ValueError("whole_batch: the processes' outputs or targets differ in shape beyond the batch axis "
                             "(sequences padded per process?): pad them to one length")
        if all(h[k] < 0 for h in headers):
            return [None] * (k * len(headers))
        if any(h[k] < 0 for h in headers):      # (rare: a last batch smaller than the processes)
            empty = collective.all_gather_object(None if joined is None else map_tensors(lambda t: t[:0].cpu(), joined))
            if joined is None:
                joined = map_tensors(lambda t: t.to(first), next(e for e in empty if e is not None))
                leaves = tensors_of(joined)
        rows = [sum(h[:k]) for h in headers]
        gathered = collective.all_gather(_packed(leaves, max(rows)))
        out: List[Any] = []
        for r, h in enumerate(headers):
            if r == collective.rank:
                out += local
                continue
            taken = iter(_unpacked(gathered[r][:rows[r]], leaves))
            theirs = map_tensors(lambda t: next(taken), joined)
            used = [n for n in h[:k] if n]
            pieces = iter(split_structure(theirs, used) if len(used) > 1 else [theirs] * len(used))
            out += [next(pieces) if n else None for n in h[:k]]
        return out


def gatherings(adapter: Any, devices: Sequence[torch.device], processes: int,
               training: bool) -> Tuple[Optional[Gathering], Optional[Gathering]]:
    """An engine's exchanges for a ``whole_batch`` loss (``adapter``: its ``LossAdapter``, or
    None): in training over every device of every process (``processes``), in evaluation over
    this process's; None where there is nothing to exchange."""
    if adapter is None or not adapter.whole_batch:
        return None, None
    local = Gathering(devices) if len(devices) > 1 else None
    if processes == 1:
        return local if training else None, local
    return Gathering(devices, get_collective(new_group=True)), local


def _packed(leaves: List[torch.Tensor], rows: int) -> torch.Tensor:
    """The tensors' bytes side by side, a row a sample (``rows``: zeros after theirs)."""
    data = torch.cat([t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous().view(torch.uint8)
                      for t in leaves], dim=1)
    if data.shape[0] < rows:
        data = torch.cat([data, data.new_zeros((rows - data.shape[0], data.shape[1]))])
    return data


def _unpacked(data: torch.Tensor, like: List[torch.Tensor]) -> List[torch.Tensor]:
    """``_packed``'s tensors back, each of ``like``'s dtype and shape beyond the batch axis."""
    out, start = [], 0
    for t in like:
        width = _row_bytes(t)
        out.append(data[:, start:start + width].contiguous().view(t.dtype).reshape((data.shape[0],) + t.shape[1:]))
        start += width
    return out


def _row_bytes(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) * t.element_size()
