"""Several processes on one stream, other than every process reading it whole
(``stream_loader.py``): ``dispatch_batches`` and ``sharded_stream``.

``dispatch_batches``: rank 0 reads a stream and sends every other process its part of each batch.

Without it every process reads the whole stream and keeps its part (``stream_loader.py``): N
processes read it N times, which costs nothing extra for a stream made in memory and N times
the traffic for one read over a network (Hugging Face's streaming datasets, shards in object
storage) or decoded at a cost. With it (Accelerate's ``dispatch_batches``) rank 0 alone reads:
it collates every process's part of a global batch (the same parts as without it, so the
training is the same) and sends each its own, pickled, point to point
(``Collective.scatter_object``); the other processes never open the stream. The end of an
epoch's batches, or rank 0's error while reading, is sent in a batch's place, so no process
waits for a batch that will not come. Every process asks for the same batches (they step
together), so rank 0 never sends one nobody takes.

``sharded_stream``: each process's stream is its own share, sharded at the source (Hugging
Face's ``split_dataset_by_node``, WebDataset's ``split_by_node``), as a DDP script's: each
reads only its share, so reading is split between the processes (a stream read slowly is read
N times as fast). A global batch is then every process's next part (the parts' sizes as
always): the same training on any number of devices of each process, not the one device's
order of an unsharded stream. An epoch is as many full batches as every share holds parts
of; what a longer share holds beyond them is not read that epoch (``fit`` says how much).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, List, Tuple

from ..core.errors import PeerFailed
from ..core.parts import even_part
from ..distributed import get_collective
from .batch import Batch

BATCH, END, FAILED = "batch", "end", "failed"


class Dispatch:
    """Rank 0's ``send`` of the parts; the others' ``receive`` (see the module docstring)."""

    def __init__(self, dataset: Any):
        self.name = type(dataset).__name__

    def send(self, samples: Iterator[Tuple[int, List[Any]]], parts: Callable[[int, List[Any]], List[Batch]],
             count: Callable[[List[Any]], int] = len) -> Iterator[Batch]:
        """Rank 0: for each ``(b, samples)``, every process's part (``parts``) sent with the global
        batch's ``count(samples)``; its own yielded."""
        collective = get_collective()
        try:
            for b, got in samples:
                every = parts(b, got)
                collective.scatter_object([(BATCH, (part, count(got))) for part in every])
                yield every[0]
        except Exception as e:
            collective.scatter_object([(FAILED, f"{type(e).__name__}: {e}")] * collective.world_size)
            raise
        collective.scatter_object([(END, None)] * collective.world_size)

    def receive(self) -> Iterator[Tuple[Batch, int]]:
        """The other ranks: the parts rank 0 sends, each with its global batch's samples,
        until it sends the end (or its error)."""
        collective = get_collective()
        while True:
            kind, value = collective.scatter_object(None)
            if kind == END:
                return
            if kind == FAILED:
                raise PeerFailed(f"rank 0 could not read {self.name} (dispatch_batches: it reads the stream for "
                                 f"every process): {value}")
            yield value


def sharded_epoch(name: str, share: int, batch_size: int, world: int) -> Tuple[int, List[int]]:
    """``sharded_stream``: an epoch's samples over all processes (as many full global batches
    as every share holds parts of) and what each share leaves unread an epoch; every process's
    ``share`` (its stream's ``__len__``) is gathered (one message)."""
    shares = get_collective().all_gather_object(share)
    parts = [even_part(batch_size, world, r)[1] for r in range(world)]
    batches = min(s // p for s, p in zip(shares, parts))
    if batches == 0:
        raise ValueError(f"sharded_stream: the processes' shares of {name} hold {shares} samples, and one holds "
                         f"less than its part of a batch of {batch_size} ({parts}): give a smaller batch_size, "
                         f"or fewer processes")
    return batches * batch_size, [s - batches * p for s, p in zip(shares, parts)]


def one_way_to_read(dispatch_batches: bool, sharded_stream: bool) -> None:
    """Refuse both modes at once (``evaluate``'s and ``predict``'s keywords)."""
    if dispatch_batches and sharded_stream:
        raise ValueError("dispatch_batches (rank 0 reads for all) and sharded_stream (each process reads its own "
                         "share) say two ways to read a stream: give one")
