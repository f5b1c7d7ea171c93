"""A stream that yields whole batches: ``DataLoader(stream, batch_size=None)`` over an
``IterableDataset`` whose ``__iter__`` batches (WebDataset's ``.batched(64)``, a generator of
``(x, y)`` batches read from a store, a Hugging Face dataset's ``.iter(batch_size=64)``).

Each batch it yields is one global batch, of any size (a short one where a shard ends): every
process reads the stream whole, in its order, and keeps its own part of each batch; each
device's part of it is cut as any batch's. So N devices and N processes take the steps a plain
loop takes over that ``DataLoader``, one per batch. The rest is ``StreamLoader``'s: an epoch is
a pass read to its end (``__len__``, if it has one, counts its batches), or ``steps_per_epoch``
batches of a stream that runs on; ``set_epoch`` before each pass; workers (each yields its own
batches, taken in turn as the ``DataLoader`` takes them); a resume reads up to its batch.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_convert

from .batch import Batch, batch_size as size_of, split_structure
from .samplers import Drawn
from .stream_loader import StreamLoader


class IndexedBatches(IterableDataset):
    """A map-style dataset whose items are whole batches (``DataLoader(dataset, batch_size=None)``:
    batches saved one per file, a pre-batched store) read as a stream of them: each epoch in
    dptrain's order of its items (shuffled by ``(seed, epoch)``, or in order), or in its
    ``sampler``'s order where one picks them, drawn by ``(seed, epoch)``; each worker reads its
    share, taken in turn (as a ``DataLoader``'s workers are)."""

    def __init__(self, dataset: Any, shuffle: bool, seed: int, sampler: Any = None):
        self.dataset, self.shuffle, self.seed, self.epoch = dataset, shuffle, seed, 0
        self.drawn = Drawn(sampler, batched=False) if sampler is not None else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.drawn.length if self.drawn is not None else len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        if self.drawn is not None:
            order: Any = self.drawn.indices(self.seed, self.epoch)
        elif self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            order = range(len(self.dataset))
        worker = get_worker_info()
        if worker is not None:
            order = order[worker.id::worker.num_workers]
        return (self.dataset[i] for i in order)


class BatchedStream(StreamLoader):
    """Iterate over this process's part of each batch a batching ``IterableDataset`` yields.

    >>> loader = BatchedStream(stream, convert=default_convert)     # its batches, each a global batch
    >>> for part in loader: ...
    """

    def __init__(self, dataset: Any, convert: Optional[Callable[[Any], Batch]] = None, **options: Any):
        if options.get("sharded"):
            raise ValueError(f"sharded_stream: {type(dataset).__name__} yields whole batches (a DataLoader's "
                             f"batch_size=None), each one global batch that every process reads; make it yield "
                             f"samples to shard it by process")
        if options.get("drop_last"):
            raise ValueError(f"drop_last drops a short last batch of batch_size samples, but {type(dataset).__name__} "
                             f"makes the batches (a DataLoader's batch_size=None): drop short ones in it")
        options.pop("batch_size", None)
        super().__init__(dataset, 1, collate_fn=lambda items: items[0], **options)
        self.convert = convert or default_convert      # (the DataLoader's collate_fn without batching)
        try:
            self.count: Optional[int] = len(dataset) if self.steps_per_epoch is None else None
        except TypeError:
            self.count = None
        self.size = None                    # (samples an epoch: known as the batches come)
        self.part = 1                       # (one item of the stream is one global batch)
        self._sizes: Dict[int, int] = {}    # this epoch's batches read so far: their samples
        #: a map-style dataset's batches: dptrain orders them (shuffled or not), not the stream
        self.ordered = isinstance(dataset, IndexedBatches)
        self.batch_size = size_of(self.example_batch())

    read_chunk = 1      # workers: one batch from each in turn, as a DataLoader of batch_size=None takes them

    @property
    def open_ended(self) -> bool:
        return self.steps_per_epoch is None and self.count is None

    def __len__(self) -> int:
        if self.steps_per_epoch is not None:
            return min(self.steps_per_epoch, self.max_batches) if self.max_batches else self.steps_per_epoch
        if self.count is None:
            return super().__len__()        # (the error: an epoch is a pass read to its end)
        return min(self.count, self.max_batches) if self.max_batches else self.count

    def global_batch_size(self, b: int) -> int:
        return self._sizes.get(b, self.batch_size)

    def global_samples(self, b: int) -> int:
        return sum(self._sizes.get(i, 0) for i in range(b))

    def count_of(self, items: List[Any]) -> int:
        return size_of(items[0])

    def _note(self, b: int, n: int) -> None:
        self.read_batches, self._sizes[b] = b + 1, n

    def _samples(self, skip: int) -> Iterator[Tuple[int, List[Any]]]:
        """``(b, [global batch b])`` from batch ``skip`` on; the ones before it read and left."""
        reader, steps = self._reader, self.steps_per_epoch
        self._sizes = {}
        if steps:
            start = self.epoch * steps          # (the stream's batches before this epoch's)
            if reader.pass_ < 0 or self._at > start:
                reader.open(0)
                self._at = 0
            while self._at < start and self._take() is not None:
                pass
        else:
            reader.open(self.epoch)
        b = 0
        while not (steps and b >= steps) and not (self.max_batches and b >= self.max_batches):
            batch = self._take()
            if batch is None:
                break
            if self.count is not None and b == self.count - 1 and self._reader.take(1):
                raise ValueError(f"{type(self.dataset).__name__} yielded more batches in pass {self.epoch + 1} than "
                                 f"its __len__ ({self.count}): make __len__ count them all, or give steps_per_epoch")
            self._note(b, size_of(batch))
            if b >= skip:
                yield b, [batch]
            b += 1
        if skip and b < skip:
            raise ValueError(f"{type(self.dataset).__name__} yielded {b} batches in pass {self.epoch + 1}, fewer than "
                             f"the {skip} the checkpoint trained of it: resume on the same stream")
        if not steps:
            reader.close()

    def _take(self) -> Optional[Batch]:
        """The stream's next batch (``steps_per_epoch``: from its next pass where one ends)."""
        got = self._reader.take(1)
        if not got and self.steps_per_epoch:
            self._next_pass()
            got = self._reader.take(1)
        if not got:
            return None
        self._at += 1
        return self.convert(got[0])

    def _part(self, b: int, samples: List[Any], rank: Optional[int] = None) -> Batch:
        batch = samples[0]
        n = size_of(batch)
        part = self.part_of(b, n, rank)
        if part.start == part.stop:
            return self.empty_batch()
        if part.stop - part.start == n:         # (one process: the batch as it came)
            return batch
        return split_structure(batch, [part.start, part.stop - part.start, n - part.stop])[1]

    def read_as_samples(self) -> None:
        return None         # (its items are read as batches)

    def example_batch(self) -> Batch:
        """The stream's first batch (read apart: the epochs' reads do not move)."""
        return self.convert(super().example())

    def example(self) -> Batch:
        """A batch of the stream's first sample."""
        first = self.example_batch()
        return split_structure(first, [1, size_of(first) - 1])[0]
