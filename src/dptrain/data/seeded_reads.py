"""Reading a part of a batch under seeds that depend only on ``(seed, epoch, position)``.

``DatasetLoader`` (``dataset_loader.py``) hands each part of a global batch to its
``DataLoader`` as a ``_Part`` of indices that knows where it sits in the epoch; ``_Seeded``
wraps the Dataset and reads each sample under its seeds, so random transforms draw the same
numbers whatever the workers and processes, and a resumed epoch sees what an unbroken one saw.
It watches the first parts to learn which generators the Dataset draws from, and seeds only
those from then on.
"""
from __future__ import annotations

import ctypes
import pickle
import random
import weakref
from typing import Any, Callable, Dict, List, Set, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Subset


class _Part(list):
    """The indices of one process's part of a batch, with what seeds its samples: the run's
    seed, the epoch, and the position of its first sample in the epoch's order."""
    seed = None


class _Seeded(Dataset):
    """Reads a part of a batch under seeds that depend only on ``(seed, epoch, position)``,
    restoring the caller's random state afterwards.

    Each sample is read with every generator it draws from seeded by its position: torch's
    (what torchvision's transforms draw from; the generator's own ``manual_seed`` takes 1.3
    us, ``torch.manual_seed`` 116), Python's ``random`` and NumPy's (albumentations' and
    hand-written augmentations'; 4.5 and 3 us to seed), so a sample draws the same numbers
    whatever the workers and processes read it with. A dataset that reads a list of indices
    in one call of its own (``__getitems__``, ``reads_in_batches``) is called once per part,
    under the part's seeds. The first ``WATCH`` parts are also watched: a dataset that drew
    no number there is read as it is from then on (text, lookups, fixed transforms: the
    seeding cost 1-2 us a sample and 30 us a part, 4-6% of a text classifier's step, issue
    22); one that drew keeps torch's generator seeded, and Python's and NumPy's only if it
    drew from them (torch-only augmentation does not pay for their states: 68 us a part).
    What the watch found is kept for the Dataset object (weakly): a later loader of it in this
    process (each ``evaluate`` call, each ``fit``) watches one part, not ``WATCH``, so a drawing
    transform added since is still caught; its data workers' watches are not brought back.
    """
    WATCH = 8

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self._batched = reads_in_batches(dataset)
        # Read unseeded as torch's DataLoader reads: one __getitems__ call where the dataset
        # has one (a Subset's maps the indices and reads in one list comprehension; calling
        # its __getitem__ per sample cost 0.3 us a sample more: 60 us of a 256-sample batch).
        self._getitems = getattr(dataset, "__getitems__", None)
        self._watch = self.WATCH
        self._draws: Set[str] = set()       # the generators it drew from while watched
        known = _seen_draws(dataset)
        if known is not None:       # watched by an earlier loader of this process: one part, to see it still is
            self._watch, self._draws = 1, set(known)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def _read(self, indices: List[int]) -> List[Any]:
        return self._getitems(list(indices)) if self._getitems is not None else [self.dataset[i] for i in indices]

    def __getitems__(self, indices: List[int]) -> List[Any]:
        where = getattr(indices, "seed", None)
        watching = self._watch > 0
        if where is None or not (watching or self._draws):
            return self._read(indices)
        self._watch -= watching
        out = self._read_part(indices, where, watching)
        if watching and not self._watch:
            _remember(self.dataset, self._draws)
        return out

    def _read_part(self, indices: List[int], where: Tuple[int, int, int], watching: bool) -> List[Any]:
        seed_, epoch, start = where
        if watching and not self._batched:
            return self._read_watched(indices, seed_, epoch, start)
        # torch's generator stays seeded for any dataset that draws (its numbers are the ones
        # that must not depend on the processes, and a rare draw can hide from the watch).
        uses = list(_GENERATORS) if watching else sorted(self._draws | {"torch"})
        saved = {name: _GENERATORS[name][0]() for name in uses}
        try:
            if self._batched:
                part_seed = hash((seed_, epoch, start, 1)) % 2**32     # ints (not str) hash alike in every run
                return self._seeded(watching, uses, part_seed, lambda: self.dataset.__getitems__(list(indices)))
            return self._read_seeded(indices, seed_, epoch, start)
        finally:
            for name, state in saved.items():
                _GENERATORS[name][1](state)

    def _read_seeded(self, indices: List[int], seed_: int, epoch: int, start: int) -> List[Any]:
        """Each sample read under its seeds, for torch's generator and those it was seen drawing from."""
        # The usual read, inline: the seeding cost 1.8 us a sample with two calls more, 1.6 inline.
        out, dataset, manual_seed = [], self.dataset, torch.default_generator.manual_seed
        python = random.seed if "random" in self._draws else None
        numpy = np.random.seed if "numpy" in self._draws else None
        for k, i in enumerate(indices, start):
            sample_seed = _sample_seed(seed_, epoch, k)
            manual_seed(sample_seed)
            if python is not None:
                python(sample_seed)
            if numpy is not None:
                numpy(sample_seed % 2**32)
            out.append(dataset[i])
        return out

    def _read_watched(self, indices: List[int], seed_: int, epoch: int, start: int) -> List[Any]:
        """A watched part: read with the generators already seen drawing seeded per sample
        (none before the first draw), the others left as the caller had them and compared
        after the part; read again, sample by sample under each sample's seeds, only if one of
        those moved (then restored). Seeding and comparing every generator for every sample
        cost 6.5 us a sample with torch's alone (~2 ms a fresh ``dptrain.evaluate`` of the text
        classifier, session 18), and ~50 us with Python's and NumPy's (NumPy's state takes
        50-75 us to read and 54 to set: 145 ms of a fresh evaluation of 3,072 augmented images,
        0.67x the plain loop, session 55). A part's watch reads each generator's state once (to
        restore it, should it move), and after the part compares torch's and Python's states
        and NumPy's position (``_numpy_mark``: 1.3 us, not a second 75 us read): 190 us a
        quiet part, 252 before session 56 (``bench_seeded_reads.py --watch``); a part that drew
        from a new generator is read twice."""
        seeded = self._draws | {"torch"} if self._draws else set()
        caller = {name: get() for name, (get, _, _) in _GENERATORS.items()}
        marks = {**caller, "numpy": _numpy_mark()}
        restore = set(_GENERATORS)          # (all, should the read fail)
        try:
            out = self._read_seeded(indices, seed_, epoch, start) if seeded else self._read(indices)
            moved = {name for name in _GENERATORS
                     if name not in seeded and not _same_state(marks[name], _MARKS[name]())}
            if not moved:
                restore = seeded
                return out
            self._draws |= moved
            restore = self._draws | {"torch"}
            return self._read_seeded(indices, seed_, epoch, start)
        finally:
            for name in restore:
                _GENERATORS[name][1](caller[name])

    def _seeded(self, watching: bool, uses: List[str], seed: int, read: Callable[[], Any]) -> Any:
        """``read()`` with the generators ``uses`` seeded by ``seed`` (noting, while
        watched, which of them it drew from)."""
        for name in uses:
            _GENERATORS[name][2](seed % 2**32 if name == "numpy" else seed)
        fresh = {name: _GENERATORS[name][0]() for name in uses} if watching else {}
        out = read()
        self._draws.update(name for name, state in fresh.items() if not _same_state(state, _GENERATORS[name][0]()))
        return out


_SEEN: Dict[int, Tuple["weakref.ref[Any]", frozenset]] = {}      # id(dataset): (it, what its watch found)


def _seen_draws(dataset: Any) -> Any:
    """The generators an earlier watch of ``dataset`` (this very object) saw it draw from, or None."""
    entry = _SEEN.get(id(dataset))
    return entry[1] if entry is not None and entry[0]() is dataset else None


def _remember(dataset: Any, draws: Set[str]) -> None:
    """Keep what the watch found for as long as ``dataset`` lives (an object with no weak
    references, a class with ``__slots__``: not kept)."""
    key = id(dataset)
    try:
        _SEEN[key] = (weakref.ref(dataset, lambda _, seen=_SEEN: seen.pop(key, None)), frozenset(draws))
    except TypeError:
        pass


def reads_in_batches(dataset: Any) -> bool:
    """Whether ``dataset`` reads a list of indices in one call of its own (``__getitems__``),
    which is then seeded once per part. torch's ``Subset`` and ``StackDataset`` have a
    ``__getitems__`` that reads sample by sample unless the dataset inside reads in batches:
    they are seen through, so a ``random_split`` or ``validation_split`` part of a Dataset
    keeps per-sample seeds (seeded per part, its augmentation depended on how the batch was
    split over processes)."""
    kind = type(dataset)
    if isinstance(dataset, Subset) and kind.__getitems__ is Subset.__getitems__:
        return reads_in_batches(dataset.dataset)
    if _Stack is not None and isinstance(dataset, _Stack) and kind.__getitems__ is _Stack.__getitems__:
        inner = dataset.datasets.values() if isinstance(dataset.datasets, dict) else dataset.datasets
        return any(reads_in_batches(d) for d in inner)
    return callable(getattr(dataset, "__getitems__", None))


_Stack = getattr(torch.utils.data, "StackDataset", None)     # (torch >= 2.2)


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


def _numpy_mark() -> Any:
    """Where NumPy's global generator stands, cheaply: the bytes of its MT19937 key and
    position, read in place (1.3 us; ``np.random.get_state`` takes 50-75 us: it copies the key
    a word at a time). Any draw moves the position, save one: a legacy normal served from the
    cached second of a pair (then seen at the part's next draw, or the next part's). Another
    bit generator behind ``np.random`` (``set_bit_generator``): its whole state."""
    bit_generator = _numpy_bit_generator()
    if type(bit_generator).__name__ != "MT19937":       # (its state a dict, arrays in some: as bytes)
        return pickle.dumps(np.random.get_state(legacy=False))
    return ctypes.string_at(bit_generator.ctypes.state_address, _MT19937_BYTES)


_MT19937_BYTES = 624 * 4 + 4            # numpy/random/src/mt19937/mt19937.h: uint32 key[624]; int pos
_numpy_bit_generator = getattr(np.random, "get_bit_generator", None) or (lambda: np.random.mtrand._rand._bit_generator)


# name: (get the state, set it, seed it)
_GENERATORS: Dict[str, Tuple[Callable[[], Any], Callable[[Any], None], Callable[[int], None]]] = {
    "torch": (torch.get_rng_state, torch.set_rng_state, torch.default_generator.manual_seed),
    "random": (random.getstate, random.setstate, random.seed),
    "numpy": (np.random.get_state, np.random.set_state, np.random.seed),
}
# name: a cheap mark of where it stands (changed by any draw)
_MARKS: Dict[str, Callable[[], Any]] = {"torch": torch.get_rng_state, "random": random.getstate, "numpy": _numpy_mark}
