"""Mini-batches from tensors held in memory, shuffled per epoch by a seeded generator."""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, Optional, Tuple, TypeVar

import torch

T = TypeVar("T")


class ArrayLoader:
    """Iterate over ``(X[idx], y[idx])`` batches of in-memory tensors.

    The order of epoch ``e`` depends only on ``(seed, e)``, so a run can be resumed or
    reproduced from the epoch number alone; ``set_epoch`` picks it, as with PyTorch's
    ``DistributedSampler``. The last batch is smaller unless ``drop_last``.

    With ``world_size > 1`` every process walks the same global batches (same seed, same
    order) and yields only its own consecutive part of each: rank ``r`` gets part ``r`` of
    ``world_size`` parts whose sizes differ by at most one (an empty part when a last
    batch has fewer samples than processes). Over an epoch every sample is used exactly
    once, by one process.

    >>> loader = ArrayLoader(X, y, batch_size=256, shuffle=True, seed=0)
    >>> for X_batch, y_batch in loader: ...
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False, max_batches: Optional[int] = None,
                 rank: int = 0, world_size: int = 1):
        if len(X) != len(y):
            raise ValueError(f"X and y must have the same number of samples, got {len(X)} and {len(y)}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"max_batches must be at least 1, got {max_batches}")
        self.X, self.y, self.batch_size = X, y, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.max_batches, self.epoch = max_batches, 0
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {rank} of {world_size}")
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self.X) // self.batch_size if self.drop_last else -(-len(self.X) // self.batch_size)
        return min(n, self.max_batches) if self.max_batches else n

    @property
    def global_num_samples(self) -> int:
        """Samples one epoch yields over all processes (after ``drop_last``, ``max_batches``)."""
        full = len(self) * self.batch_size
        return min(full, len(self.X)) if not self.drop_last else full

    @property
    def num_samples(self) -> int:
        """Samples one epoch yields to this process."""
        if self.world_size == 1:
            return self.global_num_samples
        return sum(_part(self.global_batch_size(b), self.rank, self.world_size)[1] for b in range(len(self)))

    def global_batch_size(self, b: int) -> int:
        """The size of batch ``b`` (from 0) of an epoch over all processes: every process
        knows it without a message."""
        return min(self.batch_size, self.global_num_samples - b * self.batch_size)

    def order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.X))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.X), generator=g)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return self.batches()

    def batches(self, skip: int = 0) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's batches from batch ``skip`` on (to resume an epoch part-way)."""
        order, bs = self.order(), self.batch_size
        for b in range(skip, len(self)):
            lo, hi = b * bs, min((b + 1) * bs, len(self.X))
            start, size = _part(hi - lo, self.rank, self.world_size)
            lo, hi = lo + start, lo + start + size
            if self.shuffle:
                idx = order[lo:hi]
                yield self.X[idx], self.y[idx]
            else:
                yield self.X[lo:hi], self.y[lo:hi]


def _part(n: int, rank: int, parts: int) -> Tuple[int, int]:
    """``(start, size)`` of part ``rank`` of ``n`` items cut in ``parts`` nearly equal parts."""
    base, extra = divmod(n, parts)
    return rank * base + min(rank, extra), base + (rank < extra)


class _End:
    pass


def prefetch(batches: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Produce the next ``depth`` items of ``batches`` on a background thread.

    While GPUs compute, the calling thread idles: gathering the next batch then costs
    nothing. (On virtual CPU devices it would only move 0.35 ms of an 11 ms LeNet step onto
    cores the devices are using, so ``dptrain train`` prefetches for GPUs only.) The
    producer computes with one intra-op thread and re-raises its errors in the consumer.
    """
    items: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for item in batches:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(_End)
        except BaseException as e:   # handed to the consumer
            items.put(e)

    worker = threading.Thread(target=produce, name="dptrain-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = items.get()
            if item is _End:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join(timeout=10)
