"""Mini-batches of in-memory tensors, in an order that depends only on ``(seed, epoch)``.

``EpochPlan`` is the order and the cut shared by every loader: the epoch's permutation,
its global batches, and each process's consecutive part of each global batch. It does not
depend on the number of processes or devices: a global batch holds the same samples
whoever computes it (unlike PyTorch's ``DistributedSampler``, whose order changes with the
world size). ``TensorLoader`` gathers batches from tensors held in memory; ``DatasetLoader``
(``dataset_loader.py``) reads a ``torch.utils.data.Dataset``, with worker processes.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, Optional, Tuple, TypeVar

import torch

from ..core.parts import even_part
from .batch import Batch, as_tensors, batch_size as size_of, map_tensors, tensors_of

T = TypeVar("T")


class EpochPlan:
    """Which samples each batch of an epoch holds, and which of them this process takes.

    The order of epoch ``e`` depends only on ``(seed, e)``; ``set_epoch`` picks it, as with
    PyTorch's ``DistributedSampler``. The last batch is smaller unless ``drop_last``. With
    ``world_size > 1`` every process walks the same global batches and takes only its own
    consecutive part of each: rank ``r`` gets part ``r`` of ``world_size`` parts whose sizes
    differ by at most one (an empty part when a last batch has fewer samples than
    processes). Over an epoch every sample is used exactly once, by one process.
    """

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, max_batches: Optional[int] = None, rank: int = 0, world_size: int = 1):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
            raise ValueError(f"max_batches must be a whole number >= 1, got {max_batches!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {rank} of {world_size}")
        if num_samples < 1:
            raise ValueError("the data holds no sample: give at least one")
        if drop_last and num_samples < batch_size:
            raise ValueError(f"drop_last drops a last batch smaller than {batch_size}, and the data's {num_samples} "
                             f"samples make no other: every batch would be dropped; use a batch size of "
                             f"{num_samples} or less, or drop_last=False")
        self.size, self.batch_size = num_samples, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.max_batches, self.epoch = max_batches, 0
        self.rank, self.world_size = rank, world_size
        self.balancer = None            # --balance: who reads which part (see balance.py)
        self.batches_per_step = 1       # accumulate_grad_batches (accumulate.py): batches an update sums
        self.least_part = 1             # a process's part of a batch: at least this, or none (BatchNorm: 2)
        self.source: Any = None         # the training data as given (run.train_data), once read
        self.first_step: Optional[int] = None      # the updates before this epoch, if the loop said

    def set_epoch(self, epoch: int, first_step: Optional[int] = None) -> None:
        """Epoch ``epoch`` (from 0) comes next, after ``first_step`` updates (the balancer's
        count of them, ``step_of``; by default epochs of this one's length)."""
        self.epoch, self.first_step = epoch, first_step

    def __len__(self) -> int:
        n = self.size // self.batch_size if self.drop_last else -(-self.size // self.batch_size)
        return min(n, self.max_batches) if self.max_batches else n

    @property
    def global_num_samples(self) -> int:
        """Samples one epoch yields over all processes (after ``drop_last``, ``max_batches``)."""
        full = len(self) * self.batch_size
        return min(full, self.size) if not self.drop_last else full

    @property
    def num_samples(self) -> int:
        """Samples one epoch yields to this process."""
        if self.world_size == 1:
            return self.global_num_samples
        return sum(part.stop - part.start for _, part in self.parts())

    def global_batch_size(self, b: int) -> int:
        """The size of batch ``b`` (from 0) of an epoch over all processes: every process
        knows it without a message."""
        return min(self.batch_size, self.global_num_samples - b * self.batch_size)

    def global_samples(self, b: int) -> int:
        """Samples of the epoch's first ``b`` batches over all processes."""
        return sum(self.global_batch_size(i) for i in range(b))

    def order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.size)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.size, generator=g)

    def parts(self, skip: int = 0) -> Iterator[Tuple[int, slice]]:
        """``(b, positions)`` for this process's part of each batch from batch ``skip`` on;
        ``positions`` index ``order()``."""
        bs = self.batch_size
        for b in range(skip, len(self)):
            lo, hi = b * bs, min((b + 1) * bs, self.size)
            part = self.part_of(b, hi - lo)
            yield b, slice(lo + part.start, lo + part.stop)

    def step_of(self, b: int) -> int:
        """The update (counted from the run's first) that batch ``b`` of this epoch goes into:
        the balancer's weights change by update, and with accumulation an update is a group."""
        k = self.batches_per_step
        first = self.first_step if self.first_step is not None else self.epoch * -(-len(self) // k)
        return first + b // k

    def part_of(self, b: int, n: int, rank: Optional[int] = None) -> slice:
        """Process ``rank``'s (this process's) consecutive part of batch ``b`` (from 0), of ``n`` samples."""
        rank = self.rank if rank is None else rank
        if self.balancer is not None:
            start, size = self.balancer.process_part(self.step_of(b), n, rank)
        else:
            start, size = even_part(n, self.world_size, rank, self.least_part)
        return slice(start, start + size)


def no_sparse(data: Batch) -> None:
    """A sparse matrix among the tensors (torch's sparse layouts, SciPy's ``csr_matrix`` from a
    ``TfidfVectorizer``) is an error with the fixes: batches are cut from dense tensors."""
    leaves = list(data.values()) if isinstance(data, Mapping) else list(data) if isinstance(data, (tuple, list)) \
        else [data]
    for x in leaves[:8]:        # ((X, y), a dict of columns; not each item of a long list of samples)
        torch_sparse = isinstance(x, torch.Tensor) and x.layout != torch.strided
        if not (torch_sparse or callable(getattr(x, "toarray", None)) and hasattr(x, "nnz")):
            continue
        dense = "X.to_dense()" if torch_sparse else "torch.from_numpy(X.toarray())"
        row = "X[i].to_dense()" if torch_sparse else "torch.from_numpy(X[i].toarray()[0])"
        kind = f"a {str(x.layout).replace('torch.', '')} tensor" if torch_sparse else f"SciPy's {type(x).__name__}"
        raise TypeError(f"the data holds a sparse matrix ({kind}, {x.shape[0]} rows), which batches are "
                        f"not cut from: give {dense} if it fits in memory, or a Dataset of its rows made dense one "
                        f"by one: class Rows(torch.utils.data.Dataset): __len__ = lambda self: X.shape[0]; "
                        f"__getitem__ = lambda self, i: ({row}, y[i])")


class TensorLoader(EpochPlan):
    """Batches gathered from tensors in memory: a tensor, a tuple/list or a dict of them.

    >>> loader = TensorLoader((X, y), batch_size=256, shuffle=True, seed=0)
    >>> for X_batch, y_batch in loader: ...
    >>> for batch in TensorLoader({"image": X, "label": y}, 256): batch["image"] ...
    """

    def __init__(self, data: Batch, batch_size: int, **plan: Any):
        data = as_tensors(data)
        no_sparse(data)
        n = size_of(data)          # checks every tensor holds the same number of samples
        super().__init__(n, batch_size, **plan)
        self.data = data
        self.device: Optional[torch.device] = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in tensors_of(self.data))

    def to(self, device: torch.device) -> "TensorLoader":
        """Hold the data on ``device`` (a GPU): batches are then gathered there, with no copy
        from the host per batch. Each tensor keeps its dtype (uint8 images stay uint8)."""
        self.data = map_tensors(lambda t: t.to(device), self.data)
        self.device = torch.device(device)
        return self

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def example(self) -> Batch:
        """A batch of the first sample (to show a lazy model its input)."""
        return map_tensors(lambda t: t[:1], self.data)

    def batches(self, skip: int = 0) -> Iterator[Batch]:
        """This epoch's batches from batch ``skip`` on (to resume an epoch part-way)."""
        order = self.order() if self.shuffle else None
        if order is not None and self.device is not None:
            order = order.to(self.device)       # once an epoch: the gathers then stay on the device
        for _, part in self.parts(skip):
            if order is None:
                yield map_tensors(lambda t: t[part], self.data)
            else:
                idx = order[part]
                yield map_tensors(lambda t: t[idx], self.data)


class ArrayLoader(TensorLoader):
    """Iterate over ``(X[idx], y[idx])`` batches of in-memory tensors (or NumPy arrays).

    >>> loader = ArrayLoader(X, y, batch_size=256, shuffle=True, seed=0)
    >>> for X_batch, y_batch in loader: ...
    """

    def __init__(self, X: Any, y: Any, batch_size: int, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, max_batches: Optional[int] = None, rank: int = 0, world_size: int = 1):
        if len(X) != len(y):
            raise ValueError(f"X and y must have the same number of samples, got {len(X)} and {len(y)}")
        super().__init__((X, y), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         max_batches=max_batches, rank=rank, world_size=world_size)
        self.X, self.y = self.data


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
