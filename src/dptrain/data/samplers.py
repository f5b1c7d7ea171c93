"""The user's sampler or batch sampler, drawn the same in every process, epoch by epoch.

A ``DataLoader``'s sampler that picks the samples (``WeightedRandomSampler``,
``SubsetRandomSampler``, repeats) or a batch sampler that makes the batches (batches bucketed
by sequence length) decides what an epoch holds. ``Drawn`` draws it once an epoch under a seed
of ``(seed, epoch)`` (its ``generator`` for that draw, or torch's; ``set_epoch`` first if it
has one), so every process draws the same indices, and a resumed epoch those an unbroken one
drew; ``DatasetLoader`` then cuts them into the global batches (the batch sampler's own
batches, or ``batch_size`` each) and each process reads its part. A sampler that takes every
sample once (sequential, shuffling, a DDP script's ``DistributedSampler``) is replaced by
dptrain's own order and sharding (``picks_of`` says which is which), shuffled or not as
the loader was (``shuffles``: ``fit`` keeps a ``shuffle=False`` loader's order).
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any, List, Optional, Tuple

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

_NONE = object()


def picks_of(loader: DataLoader) -> Tuple[Optional[Sampler], Optional[Any]]:
    """``(sampler, batch_sampler)`` of a ``DataLoader``: its sampler if it picks the samples,
    its batch sampler if it is not PyTorch's ``BatchSampler`` (it makes the batches); None
    for what dptrain's own order replaces."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        return None, batch_sampler
    sampler = loader.sampler
    whole = isinstance(sampler, (SequentialSampler, DistributedSampler)) or (
        type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(loader.dataset))
    return (None if whole else sampler), None


def shuffles(loader: DataLoader) -> Optional[bool]:
    """Whether ``loader`` reads its samples shuffled (a ``RandomSampler``, a shuffling
    ``DistributedSampler``) or in order (``shuffle=False``: a ``SequentialSampler``); None when
    a sampler or batch sampler of the user's own decides the order (``picks_of``)."""
    sampler, batch_sampler = picks_of(loader)
    if sampler is not None or batch_sampler is not None or isinstance(loader.dataset, IterableDataset):
        return None
    own = loader.sampler
    return bool(own.shuffle) if isinstance(own, DistributedSampler) else not isinstance(own, SequentialSampler)


def draw(sampler: Any, seed: int, epoch: int) -> List[Any]:
    """What ``sampler`` gives for ``epoch`` (indices, or batches of indices), drawn under ``seed``."""
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)
    own = getattr(sampler, "generator", _NONE)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        if own is not _NONE:
            sampler.generator = torch.Generator().manual_seed(seed)
        try:
            return list(sampler)
        finally:
            if own is not _NONE:
                sampler.generator = own


class Drawn:
    """An epoch's draw of a sampler (``batched``: a batch sampler), kept for the epoch.

    >>> drawn = Drawn(WeightedRandomSampler(weights, 1000), batched=False)
    >>> drawn.indices(seed=0, epoch=3)                  # 1000 indices, the same in every process
    """

    def __init__(self, sampler: Any, batched: bool):
        try:
            self.length = len(sampler)
        except TypeError:
            raise TypeError(f"the {'batch ' if batched else ''}sampler {type(sampler).__name__} has no __len__: "
                            f"an epoch's length must be known before it starts: give it one") from None
        self.sampler, self.batched = sampler, batched
        self._epoch: Optional[Tuple[int, int]] = None
        self._indices: List[int] = []
        self._offsets: List[int] = [0]

    def _draw(self, seed: int, epoch: int) -> None:
        if self._epoch == (seed, epoch):
            return
        got = draw(self.sampler, seed * 1_000_003 + epoch, epoch)
        what = "batches" if self.batched else "indices"
        if len(got) != self.length:
            raise ValueError(f"the {'batch ' if self.batched else ''}sampler {type(self.sampler).__name__} gave "
                             f"{len(got)} {what} in epoch {epoch + 1}, but its __len__ says {self.length}: make them "
                             f"agree")
        if self.batched:
            if not all(len(b) for b in got):
                raise ValueError(f"the batch sampler {type(self.sampler).__name__} gave an empty batch in epoch "
                                 f"{epoch + 1}: every batch needs a sample")
            self._indices = [int(i) for b in got for i in b]
            self._offsets = [0] + list(accumulate(len(b) for b in got))
        else:       # Python ints already (torch's samplers give tolist()'s): kept as they are
            self._indices = got if set(map(type, got)) <= {int} else [int(i) for i in got]
        self._epoch = (seed, epoch)

    def indices(self, seed: int, epoch: int) -> List[int]:
        """The epoch's indices, in order (a batch sampler's batches one after another)."""
        self._draw(seed, epoch)
        return self._indices

    def batch(self, seed: int, epoch: int, b: int) -> Tuple[int, int]:
        """A batch sampler's batch ``b`` (from 0): ``(start, size)`` in the epoch's indices."""
        self._draw(seed, epoch)
        return self._offsets[b], self._offsets[b + 1] - self._offsets[b]
