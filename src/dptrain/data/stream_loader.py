"""Batches from a stream: a ``torch.utils.data.IterableDataset`` (Hugging Face's streaming
datasets, WebDataset shards, a generator of synthetic samples).

A stream has no indices to shuffle or to shard, so every process reads it whole, in the order
it yields, cuts it into the global batches (``batch_size`` consecutive samples each) and keeps
only its own part of each (``EpochPlan.part_of``: the part a map-style dataset's process gets),
collated in the process: N processes and N devices see exactly the batches one device sees.
(Accelerate's ``IterableDatasetShard`` does the same; a stream sharded by rank would give each
process other batches, which ``agreement.fingerprint`` catches by its first sample.)

An epoch is one pass: ``len(dataset)`` samples, or, for a stream without ``__len__``, what
it yields until it ends (an "open-ended" epoch, as Keras and Lightning read such a stream: its
batches are counted as they come, the last one perhaps short; ``set_epoch(epoch)`` is called
on the dataset before a pass, if it has one, as Hugging Face's and WebDataset's shuffles
expect). Or, with ``steps_per_epoch=N`` (Keras's), N full batches of one stream that runs on
across epochs and starts its next pass where one ends (any length, endless too). A resumed
run reads the stream from its start to the checkpoint's place, dropping the samples without
collating them.

The reading itself, a pass at a time with the stream's own random states or from workers, is
``stream_reader.py``'s.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple


from ..core.parts import even_part
from .batch import Batch, map_tensors, tensors_of
from .batch_objects import collate_default
from .dispatch import Dispatch, sharded_epoch
from .loader import EpochPlan
from .stream_reader import Reader


class StreamLoader(EpochPlan):
    """Iterate over this process's part of each global batch of an ``IterableDataset``.

    >>> loader = StreamLoader(stream, batch_size=256)                      # an epoch: a pass, len(stream) samples
    >>> loader = StreamLoader(endless, batch_size=256, steps_per_epoch=100)   # an epoch: 100 batches of it
    >>> loader.set_epoch(3)
    >>> for batch in loader: ...

    Without ``__len__`` nor ``steps_per_epoch`` (``open_ended``), a pass is read to its end;
    ``len()`` is then an error, and the loop learns the epoch's end from the batches (the
    sizes of those read so far: ``global_batch_size``, ``global_samples``).
    ``sharded`` (``sharded_stream``, several processes): each process's stream is its own
    share, read in parts of a global batch; training's epoch is the full batches every share
    holds, an evaluation (``to_the_end``) reads each share to its end, so its sums cover every
    sample of every share.
    """
    stream = True

    def __init__(self, dataset: Any, batch_size: int, num_workers: int = 0,
                 collate_fn: Optional[Callable[[List[Any]], Batch]] = None, worker_timeout: float = 0.0,
                 worker_init_fn: Optional[Callable[[int], None]] = None, steps_per_epoch: Optional[int] = None,
                 worker_options: Optional[Dict[str, Any]] = None,
                 dispatch: bool = False, sharded: bool = False, to_the_end: bool = False, **plan: Any):
        plan.pop("shuffle", None)       # a stream is read in its own order
        world = plan.get("world_size", 1)
        sharded = sharded and world > 1
        if steps_per_epoch is not None:
            if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
                raise ValueError(f"steps_per_epoch must be a whole number >= 1, got {steps_per_epoch!r}")
            size: Optional[int] = steps_per_epoch * batch_size
        else:
            try:
                size = len(dataset)
            except TypeError:
                size = None
        #: sharded_stream: the part of a full batch this process reads from its own share
        self.part = even_part(batch_size, world, plan.get("rank", 0))[1] if sharded else batch_size
        self.unread: List[int] = []         # sharded_stream: each share's samples an epoch leaves
        self.share = size                   # (this process's __len__: its share, sharded)
        if sharded and to_the_end:          # (evaluation: no steps_per_epoch)
            size = None                     # (each share its own length: no global batch count)
        elif sharded and steps_per_epoch is None and size is not None:
            size, self.unread = sharded_epoch(type(dataset).__name__, size, batch_size, world)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a whole number >= 0, got {num_workers!r}")
        #: open-ended with drop_last: a short last batch is left (no length to cut the epoch at)
        self.drop_short = size is None and not sharded and bool(plan.get("drop_last"))
        if size is None:
            plan["drop_last"] = False
        super().__init__(size if size is not None else 1, batch_size, **plan)
        self.size: Optional[int] = size      # type: ignore[assignment]
        self.dataset, self.steps_per_epoch, self.num_workers = dataset, steps_per_epoch, num_workers
        self.worker_timeout = worker_timeout if num_workers else 0.0
        self.worker_init_fn, self.collate_fn = worker_init_fn, collate_fn or collate_default
        self.worker_options = dict(worker_options or {})     # a DataLoader's prefetch_factor, multiprocessing_context
        self._reader = Reader(self, num_workers)
        #: dispatch_batches with several processes: rank 0 reads, and sends the others their parts
        self.dispatch = Dispatch(self.dataset) if dispatch and self.world_size > 1 else None
        self.sharded = sharded
        self._at = 0        # steps_per_epoch: the samples of the stream read so far (over its passes)
        self._example: Optional[Batch] = None
        self._empty: Optional[Batch] = None
        #: open-ended: batches of this pass read so far, and the short last one's (b, samples)
        self.read_batches = 0
        self._short_batch: Optional[Tuple[int, int]] = None

    @property
    def read_chunk(self) -> int:
        """Samples a worker yields at a time (its ``DataLoader``'s batch: workers taken in turn)."""
        return self.batch_size

    def count_of(self, samples: List[Any]) -> int:
        """The samples in what ``_samples`` gives for one global batch."""
        return len(samples)

    @property
    def open_ended(self) -> bool:
        """Whether an epoch is the stream read to its end, of no length known before."""
        return self.size is None

    @property
    def global_num_samples(self) -> Optional[int]:      # type: ignore[override]
        """Samples an epoch yields over all processes (None: open-ended, known as it ends)."""
        return None if self.size is None else super().global_num_samples

    def global_batch_size(self, b: int) -> int:
        """The size of batch ``b`` (open-ended: of one read already) over all processes."""
        if self.size is not None:
            return super().global_batch_size(b)
        short = self._short_batch
        return short[1] if short is not None and short[0] == b else self.batch_size

    def global_samples(self, b: int) -> int:
        """Samples of the epoch's first ``b`` batches over all processes (open-ended: of
        those read already)."""
        if self.size is not None:
            return super().global_samples(b)
        short = self._short_batch
        less = self.batch_size - short[1] if short is not None and short[0] < b else 0
        return min(b, self.read_batches) * self.batch_size - less

    def _note(self, b: int, n: int) -> None:
        """Open-ended: batch ``b`` of ``n`` samples (over all processes) was read."""
        self.read_batches = b + 1
        if n < self.batch_size:
            self._short_batch = (b, n)

    def __len__(self) -> int:
        if self.size is None and self.sharded:
            raise TypeError(f"sharded_stream: {type(self.dataset).__name__} has no __len__, and the processes' shares "
                            f"would end at different batches: give steps_per_epoch=N (N batches an epoch), define "
                            f"__len__ (a share's samples), or let every process read the whole stream (no "
                            f"sharded_stream: an epoch is then a pass, read to its end)")
        if self.size is None:
            raise TypeError(f"{type(self.dataset).__name__} (an IterableDataset) has no __len__: an epoch of it is "
                            f"a pass read to its end, its batches known as they come")
        return super().__len__()

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def batches(self, skip: int = 0) -> Iterator[Batch]:
        """This epoch's batches from batch ``skip`` on (to resume an epoch part-way)."""
        self.read_batches, self._short_batch = skip, None
        if self.dispatch is None:
            for b, samples in self._samples(skip):
                yield self._part(b, samples)
        elif self.rank == 0:
            yield from self.dispatch.send(self._samples(skip), self._parts, self.count_of)
        else:
            for b, (batch, n) in enumerate(self.dispatch.receive(), start=skip):
                if self.size is None:
                    self._note(b, n)
                yield batch

    def _samples(self, skip: int) -> Iterator[Tuple[int, List[Any]]]:
        """``(b, the samples of global batch b)``, from batch ``skip`` on."""
        if self.steps_per_epoch:
            yield from self._steps(skip)
            return
        reader, bs, rs = self._reader, self.batch_size, self.part
        reader.open(self.epoch)
        self._drop(skip * rs)
        if self.size is None and not self.sharded and skip and reader.read <= (skip - 1) * rs:
            raise ValueError(f"{type(self.dataset).__name__} yielded {reader.read} samples in pass {self.epoch + 1}, "
                             f"fewer than the {skip} batches of {bs} the checkpoint trained of it: resume on the "
                             f"same stream (its passes yielding what they yielded)")
        last = len(self) - 1 if self.size is not None else None
        b = skip
        while last is None or b <= last:
            if self.max_batches and b >= self.max_batches:
                break
            want = rs if self.sharded or self.size is None else min(bs, self.size - b * bs)
            samples = reader.take(want)
            if len(samples) < want and self.size is not None:
                raise self._short(reader.read)
            if len(samples) < want and self.sharded and self.share is not None and reader.read != self.share:
                raise self._short(reader.read)      # (a share read to its end: its __len__ checked there)
            if not samples or (self.drop_short and len(samples) < want):
                break
            if not self.sharded and b == last and last * bs + want == self.size and reader.take(1):
                raise ValueError(f"{type(self.dataset).__name__} yielded more samples in pass {self.epoch + 1} than "
                                 f"its __len__ ({self.size}): make __len__ count them all, or give steps_per_epoch")
            if self.size is None and not self.sharded:
                self._note(b, len(samples))
            yield b, samples
            b += 1
            if len(samples) < want:
                break
        reader.close()

    def _steps(self, skip: int) -> Iterator[Tuple[int, List[Any]]]:
        """``steps_per_epoch`` full batches of the stream, from where this epoch starts in it."""
        reader, bs = self._reader, self.part      # (a batch's samples read here: this process's part, sharded)
        start = (self.epoch * self.steps_per_epoch + skip) * bs
        if reader.pass_ < 0 or self._at > start:
            reader.open(0)
            self._at = 0
        self._drop(start - self._at)
        for b in range(skip, len(self)):
            samples: List[Any] = []
            while len(samples) < bs:
                more = reader.take(bs - len(samples))
                samples += more
                if len(samples) < bs:       # the pass ended: the next one goes on
                    self._next_pass()
            self._at = start + (b - skip + 1) * bs
            yield b, samples

    def _drop(self, n: int) -> None:
        """Read ``n`` samples and leave them (to resume part-way), in batch-sized reads."""
        while n > 0:
            got = self._reader.take(min(n, self.batch_size))
            if self.steps_per_epoch and len(got) < min(n, self.batch_size):
                self._next_pass()
            elif not got:
                break
            n -= len(got)
            self._at += len(got)

    def _next_pass(self) -> None:
        """``steps_per_epoch``: a pass ended; the next one goes on (a pass of no sample is an
        error, not an endless loop)."""
        if self._reader.read == 0:
            raise ValueError(f"{type(self.dataset).__name__} yielded no sample in pass {self._reader.pass_ + 1}: "
                             f"a stream must yield samples")
        self._reader.open(self._reader.pass_ + 1)

    def _short(self, got: int) -> ValueError:
        return ValueError(f"{type(self.dataset).__name__} yielded {got} samples in pass {self.epoch + 1}, but its "
                          f"__len__ says {self.share}: make __len__ match what __iter__ yields (every pass), or give "
                          f"steps_per_epoch=N to count an epoch in batches")

    def _part(self, b: int, samples: List[Any], rank: Optional[int] = None) -> Batch:
        """Process ``rank``'s part of global batch ``b`` (this process's by default), collated
        (sharded: ``samples`` are this process's part)."""
        mine = samples if self.sharded else samples[self.part_of(b, len(samples), rank)]
        return self.collate_fn(mine) if mine else self.empty_batch()

    def _parts(self, b: int, samples: List[Any]) -> List[Batch]:
        """Every process's part of global batch ``b``, collated (``dispatch_batches``: rank 0's work)."""
        return [self._part(b, samples, r) for r in range(self.world_size)]

    def example(self) -> Batch:
        """A batch of the stream's first sample (read apart: the epochs' reads do not move)."""
        if self._example is None:
            reader = Reader(self, 0)
            try:
                reader.open(0)
                first = reader.take(1)
            finally:
                reader.close()
            if not first:
                raise ValueError(f"{type(self.dataset).__name__} yielded no sample: a stream must yield samples")
            self._example = self.collate_fn(first)
        return self._example

    def read_as_samples(self) -> Optional[str]:
        """A line for an error of the first step where the stream's items look like whole batches
        (every tensor of its first item has a first dimension of the same size, 2 or more), which a
        stream given as it is reads as samples, ``batch_size`` of them stacked to a batch: a
        ``DataLoader(stream, batch_size=None)`` says it yields whole batches."""
        shapes = [tuple(t.shape[1:]) for t in tensors_of(self._example)] if self._example is not None else []
        if len(shapes) < 2 or not all(shapes) or len({s[0] for s in shapes}) != 1 or shapes[0][0] < 2:
            return None
        name = type(self.dataset).__name__
        return (f"dptrain: each item {name} yields is read as one sample, {self.batch_size} of them stacked to a batch "
                f"(its first item holds tensors of shapes {', '.join(str(s) for s in shapes)}); if it yields whole "
                f"batches, give DataLoader({name}(...), batch_size=None): each item is then one batch")

    def empty_batch(self) -> Batch:
        """A batch of no sample with the structure of the others."""
        if self._empty is None:
            self._empty = map_tensors(lambda t: t[:0], self.example())
        return self._empty

    def close(self) -> None:
        """Stop the worker processes now."""
        self._reader.close()
