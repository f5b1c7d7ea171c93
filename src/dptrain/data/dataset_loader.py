"""Batches from any map-style ``torch.utils.data.Dataset``, in ``EpochPlan``'s order.

``DatasetLoader`` hands this process's part of each global batch to a PyTorch
``DataLoader`` as a batch of indices, so ``num_workers`` background processes read and
collate them while the devices compute, and the order is still ``EpochPlan``'s. Samples are
read under seeds that depend only on ``(seed, epoch, position in the epoch)`` (see
``_Seeded``), so random transforms draw the same numbers whatever the number of workers,
and an epoch resumed part-way sees what an unbroken one saw; torch's random numbers (what
torchvision's transforms use) do not depend on the number of processes either.

``choose_loader.make_loader`` picks it, or another loader, for what the user gave.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from ..core.errors import DataStalled
from .batch import Batch, map_tensors
from .batch_objects import collate_default
from .loader import EpochPlan
from .samplers import Drawn
from .seeded_reads import _Part, _Seeded


def _yield_to_training(worker_id: int) -> None:
    """Readers run at a lower priority than the training threads (``lower_priority``): with
    several device threads on a machine whose cores all compute, a reader that preempts one
    stalls every device at the next step. Not with one device: there the readers' share of
    the cores is what the plain DataLoader gives them (the CNN of issue 22 evaluated at
    0.90x the plain loop with lowered readers, 0.96x without; benchmarks/RESULTS.md)."""
    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass


class _WorkerStart:
    """What each reading worker runs when it starts: the user's ``worker_init_fn`` (a
    ``DataLoader``'s: a file opened per worker, a stream's range cut per worker) after the
    lower priority, if asked. A class, not a closure, so that a spawned worker unpickles it."""

    def __init__(self, lower_priority: bool, user: Optional[Callable[[int], None]]):
        self.lower_priority, self.user = lower_priority, user

    def __call__(self, worker_id: int) -> None:
        if self.lower_priority:
            _yield_to_training(worker_id)
        if self.user is not None:
            info = get_worker_info()
            if info is not None and isinstance(info.dataset, _Seeded):    # theirs, as a DataLoader shows it
                object.__setattr__(info, "dataset", info.dataset.dataset)     # (WorkerInfo refuses setattr)
            self.user(worker_id)


def worker_start(lower_priority: bool, user: Optional[Callable[[int], None]] = None) -> Optional[Callable]:
    return _WorkerStart(lower_priority, user) if lower_priority or user is not None else None


class _Parts:
    """The batch sampler: this process's non-empty parts, in order, from batch ``skip``."""

    def __init__(self, plan: EpochPlan):
        self.plan, self.skip = plan, 0

    def __iter__(self) -> Iterator[_Part]:
        order = self.plan.indices()      # once an epoch (a tensor's slice and tolist: 3 us a batch)
        seed, epoch = self.plan.seed, self.plan.epoch
        for b, part in self.plan.parts(self.skip):
            if part.stop > part.start:
                indices = _Part(order[part])
                indices.seed = (seed, epoch, part.start)
                yield indices

    def __len__(self) -> int:
        return sum(part.stop > part.start for _, part in self.plan.parts(self.skip))


class DatasetLoader(EpochPlan):
    """Iterate over batches of a map-style ``Dataset``, read by ``num_workers`` processes.

    >>> loader = DatasetLoader(dataset, batch_size=256, shuffle=True, seed=0, num_workers=2)
    >>> loader.set_epoch(3)
    >>> for batch in loader: ...              # what collate_fn makes of 256 samples
    """

    def __init__(self, dataset: Dataset, batch_size: int, num_workers: int = 0,
                 collate_fn: Optional[Callable[[List[Any]], Batch]] = None, pin_memory: bool = False,
                 worker_timeout: float = 0.0, lower_priority: bool = False, sampler: Optional[Sampler] = None,
                 batch_sampler: Any = None, worker_init_fn: Optional[Callable[[int], None]] = None,
                 worker_options: Optional[Dict[str, Any]] = None, **plan: Any):
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise TypeError(f"{type(dataset).__name__} is not a map-style Dataset (with __len__ and __getitem__): "
                            f"a stream (an IterableDataset) is read by StreamLoader, which make_loader picks for it")
        picks = sampler if batch_sampler is None else batch_sampler
        self.drawn = Drawn(picks, batched=batch_sampler is not None) if picks is not None else None
        if self.drawn is None:
            try:
                n = len(dataset)
            except TypeError:
                raise TypeError(f"{type(dataset).__name__} has no __len__: a map-style Dataset needs one") from None
        else:       # a batch sampler's epoch holds what its batches hold (epoch 0's: for the fingerprint)
            n = len(self.drawn.indices(plan.get("seed", 0), 0)) if self.drawn.batched else self.drawn.length
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a whole number >= 0, got {num_workers!r}")
        super().__init__(n, batch_size, **plan)
        self.dataset, self.num_workers = dataset, num_workers
        self.worker_timeout = worker_timeout if num_workers else 0.0
        self.collate_fn = collate_fn or collate_default
        # A weak reference: in a reference cycle the garbage collector may close the worker
        # queues before the DataLoader says goodbye to its workers, which then linger 5 s each.
        self._sampler = _Parts(weakref.proxy(self))
        # Its own generator: making an iterator draws a seed, which must not move the caller's RNG.
        self._loader = DataLoader(_Seeded(dataset), batch_sampler=self._sampler, num_workers=num_workers,
                                  collate_fn=self.collate_fn, pin_memory=pin_memory,
                                  persistent_workers=num_workers > 0,
                                  worker_init_fn=worker_start(lower_priority, worker_init_fn),
                                  timeout=self.worker_timeout, generator=torch.Generator().manual_seed(self.seed),
                                  **((worker_options or {}) if num_workers else {}))
        self._empty: Optional[Batch] = None

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    # -- the user's sampler or batch sampler (samplers.py), where one picks the samples --------
    def order(self) -> torch.Tensor:
        return torch.tensor(self.indices(), dtype=torch.long) if self.drawn is not None else super().order()

    def indices(self) -> List[int]:
        """The epoch's indices: ``EpochPlan``'s order, or the user's sampler's or batch
        sampler's, drawn under a seed of ``(seed, epoch)``."""
        if self.drawn is None:
            return super().order().tolist()
        return self.drawn.indices(self.seed, self.epoch)

    def __len__(self) -> int:
        if self.drawn is None or not self.drawn.batched:
            return super().__len__()
        return min(self.drawn.length, self.max_batches) if self.max_batches else self.drawn.length

    @property
    def global_num_samples(self) -> int:
        if self.drawn is None or not self.drawn.batched:
            return super().global_num_samples
        start, size = self.drawn.batch(self.seed, self.epoch, len(self) - 1)
        return start + size

    def global_batch_size(self, b: int) -> int:
        if self.drawn is None or not self.drawn.batched:
            return super().global_batch_size(b)
        return self.drawn.batch(self.seed, self.epoch, b)[1]

    def parts(self, skip: int = 0) -> Iterator[Tuple[int, slice]]:
        if self.drawn is None or not self.drawn.batched:
            yield from super().parts(skip)
            return
        for b in range(skip, len(self)):            # the batch sampler's batches, of any size
            lo, n = self.drawn.batch(self.seed, self.epoch, b)
            part = self.part_of(b, n)
            yield b, slice(lo + part.start, lo + part.stop)

    def batches(self, skip: int = 0) -> Iterator[Batch]:
        """This epoch's batches from batch ``skip`` on (to resume an epoch part-way)."""
        self._sampler.skip = skip
        parts = [part.stop > part.start for _, part in self.parts(skip)]
        read = iter(self._loader) if any(parts) else iter(())
        if not self.worker_timeout and all(parts):      # the usual epoch: the DataLoader's batches as they come
            yield from read
            return
        asked = 0
        for has_samples in parts:
            if not has_samples:
                yield self.empty_batch()
                continue
            try:
                batch = next(read)
            except RuntimeError as e:
                if self.worker_timeout and "timed out" in str(e):
                    raise self._stalled(skip, asked) from None
                raise
            asked += 1
            yield batch
        next(read, None)        # let the DataLoader see the end of its epoch (its workers then wait)

    def _stalled(self, skip: int, asked: int) -> DataStalled:
        """The error for a batch the workers did not give in time: which worker (batches go
        to them in turn) and which samples."""
        order = self.order()
        parts = [part for _, part in self.parts(skip) if part.stop > part.start]
        samples = order[parts[asked]].tolist()
        shown = ", ".join(map(str, samples[:32])) + (", ..." if len(samples) > 32 else "")
        return DataStalled(
            f"no batch from the data workers in {self.worker_timeout:g} s: worker {asked % self.num_workers} is "
            f"stuck reading batch {skip + asked + 1} of epoch {self.epoch + 1} (samples {shown}) in "
            f"{type(self.dataset).__name__}.__getitem__; fix the Dataset, or allow more time with --worker-timeout "
            f"(fit: worker_timeout=)")

    def example(self) -> Batch:
        """A batch of the first sample (to show a lazy model its input)."""
        return self.collate_fn([self.dataset[0]])

    def close(self) -> None:
        """Stop the worker processes now (they also stop when the loader is dropped)."""
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._loader._iterator = None

    def empty_batch(self) -> Batch:
        """A batch of no sample with the structure of the others (a process's part of a last
        batch smaller than the number of processes)."""
        if self._empty is None:
            self._empty = map_tensors(lambda t: t[:0], self.example())
        return self._empty
