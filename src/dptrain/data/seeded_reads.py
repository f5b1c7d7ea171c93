"""Reading a part of a batch under seeds that depend only on ``(seed, epoch, position)``.

``DatasetLoader`` (``dataset_loader.py``) hands each part of a global batch to its
``DataLoader`` as a ``_Part`` of indices that knows where it sits in the epoch; ``_Seeded``
wraps the Dataset and reads the part under those seeds, so random transforms draw the same
numbers whatever the workers and processes, and a resumed epoch sees what an unbroken one saw.
It watches the first parts to learn which generators the Dataset draws from, and seeds only
those from then on.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, List, Set, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset


class _Part(list):
    """The indices of one process's part of a batch, with what seeds its samples: the run's
    seed, the epoch, and the position of its first sample in the epoch's order."""
    seed = None


class _Seeded(Dataset):
    """Reads a part of a batch under seeds that depend only on ``(seed, epoch, position)``,
    restoring the caller's random state afterwards.

    torch's generator (what torchvision's transforms draw from) is seeded per sample
    (``torch.manual_seed`` took 116 us here, the generator's own ``manual_seed`` 1.3 us);
    Python's ``random`` and NumPy's (4.5 and 3 us to seed) once per part of a batch. A
    dataset with ``__getitems__`` (a batched read) is called once per part, under the part's
    seeds. The first ``WATCH`` parts are also watched: a dataset that drew no number there is
    read as it is from then on (text, lookups, fixed transforms: the seeding cost 1-2 us a
    sample and 30 us a part, 4-6% of a text classifier's step, issue 22); one that drew keeps
    torch's generator seeded, and Python's and NumPy's only if it drew from them (torch-only
    augmentation does not pay for their states: 68 us a part).
    """
    WATCH = 8

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self._batched = callable(getattr(dataset, "__getitems__", None))
        self._watch = self.WATCH
        self._draws: Set[str] = set()       # the generators it drew from while watched

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def _read(self, indices: List[int]) -> List[Any]:
        return self.dataset.__getitems__(list(indices)) if self._batched else [self.dataset[i] for i in indices]

    def __getitems__(self, indices: List[int]) -> List[Any]:
        where = getattr(indices, "seed", None)
        watching = self._watch > 0
        if where is None or not (watching or self._draws):
            return self._read(indices)
        self._watch -= watching
        # torch's generator stays seeded for any dataset that draws (its numbers are the ones
        # that must not depend on the processes, and a rare draw can hide from the watch).
        uses = _GENERATORS if watching else self._draws | {"torch"}
        seed_, epoch, start = where
        saved = {name: _GENERATORS[name][0]() for name in uses}
        try:
            part_seed = hash((seed_, epoch, start, 1)) % 2**32     # ints (not str) hash alike in every run
            for name in uses:
                if name != "torch":
                    _GENERATORS[name][2](part_seed)
            seeded = {name: _GENERATORS[name][0]() for name in uses if name != "torch"} if watching else {}
            if self._batched:
                out = self._torch_seeded(watching, part_seed, lambda: self.dataset.__getitems__(list(indices)))
            elif watching and "torch" not in self._draws:
                out = self._read_watched(indices, seed_, epoch, start, part_seed, uses)
            elif watching:
                out = [self._torch_seeded(True, _sample_seed(seed_, epoch, k), lambda i=i: self.dataset[i])
                       for k, i in enumerate(indices, start)]
            else:   # the usual read, inline: the seeding cost 1.8 us a sample with two calls more, 1.6 inline
                out, dataset, manual_seed = [], self.dataset, torch.default_generator.manual_seed
                for k, i in enumerate(indices, start):
                    manual_seed(_sample_seed(seed_, epoch, k))
                    out.append(dataset[i])
            self._draws.update(name for name, state in seeded.items()
                               if not _same_state(state, _GENERATORS[name][0]()))
            return out
        finally:
            for name, state in saved.items():
                _GENERATORS[name][1](state)

    def _read_watched(self, indices: List[int], seed_: int, epoch: int, start: int, part_seed: int,
                      uses: Any) -> List[Any]:
        """A watched part of a Dataset not yet seen drawing from torch: read once under one
        seed, and again sample by sample under each sample's seed only if torch's generator
        moved (Python's and NumPy's seeded as before, so the second read draws what a
        sample-by-sample read would have). Seeding and comparing torch's state for every
        sample cost 6.5 us a sample, ~2 ms a fresh ``dptrain.evaluate`` of the text classifier
        (session 18); a drawing Dataset reads one part twice instead."""
        generator = torch.default_generator
        generator.manual_seed(part_seed)
        fresh = generator.get_state()
        out = [self.dataset[i] for i in indices]
        if torch.equal(fresh, generator.get_state()):
            return out
        self._draws.add("torch")
        for name in uses:
            if name != "torch":
                _GENERATORS[name][2](part_seed)
        return [self._torch_seeded(False, _sample_seed(seed_, epoch, k), lambda i=i: self.dataset[i])
                for k, i in enumerate(indices, start)]

    def _torch_seeded(self, watching: bool, seed: int, read: Callable[[], Any]) -> Any:
        """``read()`` under torch's generator seeded with ``seed`` (noting, while watched,
        whether it drew)."""
        generator = torch.default_generator
        generator.manual_seed(seed)
        fresh = generator.get_state() if watching else None
        out = read()
        if watching and "torch" not in self._draws and not torch.equal(fresh, generator.get_state()):
            self._draws.add("torch")
        return out


def _sample_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of torch's generator for the sample at ``position`` in epoch ``epoch``'s order."""
    return hash((seed, epoch, position)) % 2**63       # ints hash alike in every process


def _same_state(a: Any, b: Any) -> bool:
    """Whether two states of torch's, Python's or NumPy's generator are the same."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, tuple) and len(a) == 5 and isinstance(a[1], np.ndarray):    # NumPy's
        return a[0] == b[0] and a[2:] == b[2:] and np.array_equal(a[1], b[1])
    return a == b


# name: (get the state, set it, seed it); torch's is seeded per sample by _Seeded._torch_seeded
_GENERATORS: Dict[str, Tuple[Callable[[], Any], Callable[[Any], None], Callable[[int], None]]] = {
    "torch": (torch.get_rng_state, torch.set_rng_state, torch.default_generator.manual_seed),
    "random": (random.getstate, random.setstate, random.seed),
    "numpy": (np.random.get_state, np.random.set_state, np.random.seed),
}
