"""Reading a stream (an ``IterableDataset``) one pass at a time, for ``stream_loader.py``.

Read in this process, the stream draws its random numbers from generators of its own,
seeded by ``(seed, pass)`` (swapped in around each batch's reads; after ``WATCH`` batches
only those it drew from), so a run and its resumption read the same samples and the
training's random numbers stay the training's. With ``num_workers=N`` a ``DataLoader``'s
workers read it (each runs the dataset's ``__iter__``: shard by ``get_worker_info()``, as with
any PyTorch ``DataLoader``), seeded by ``(seed, pass)``, taking ``batch_size`` samples from
each worker in turn.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch.utils.data import DataLoader

from ..core.errors import DataStalled
from .seeded_reads import _GENERATORS, _same_state       # name: (get the state, set it, seed it)


def _as_list(samples: List[Any]) -> List[Any]:
    """A worker's ``collate_fn``: the samples as they are (collated in the process, by part)."""
    return samples


class Reader:
    """One pass over the stream at a time: where it is, and its own random states. ``loader``:
    the ``StreamLoader`` whose dataset, seed, batch size and worker settings it reads."""
    WATCH = 8

    def __init__(self, loader: Any, workers: int):
        self.loader, self.workers, self.pass_, self.read = loader, workers, -1, 0
        self._it: Optional[Iterator[Any]] = None
        self._workers: Optional[Iterator[Any]] = None
        self._states: Dict[str, Any] = {}
        self._watch, self._draws, self._moved = self.WATCH, set(_GENERATORS), set()

    def open(self, pass_: int) -> None:
        """Start pass ``pass_`` (``set_epoch(pass_)`` first, if the dataset has it)."""
        self.close()
        loader, dataset = self.loader, self.loader.dataset
        if callable(getattr(dataset, "set_epoch", None)):
            dataset.set_epoch(pass_)
        seed = hash((loader.seed, pass_, 2)) % 2**32        # ints hash alike in every process
        self.pass_, self.read = pass_, 0
        if self.workers:
            self._workers = iter(DataLoader(dataset, batch_size=loader.read_chunk, collate_fn=_as_list,
                                            num_workers=self.workers, timeout=loader.worker_timeout,
                                            worker_init_fn=loader.worker_init_fn, **loader.worker_options,
                                            generator=torch.Generator().manual_seed(seed)))
            self._it = self._from_workers(self._workers)
            return
        saved = {name: get() for name, (get, _, _) in _GENERATORS.items()}
        try:
            for _, _, seed_it in _GENERATORS.values():
                seed_it(seed)
            self._it = iter(dataset)
        finally:
            self._states = {name: _GENERATORS[name][0]() for name in _GENERATORS}
            for name, state in saved.items():
                _GENERATORS[name][1](state)

    def _from_workers(self, workers: Iterator[List[Any]]) -> Iterator[Any]:
        """The workers' samples: ``batch_size`` from each in turn, as a ``DataLoader`` gives them."""
        while True:
            try:
                chunk = next(workers)
            except StopIteration:
                return
            except RuntimeError as e:
                if "timed out" in str(e):
                    raise DataStalled(f"no sample from the stream's data workers in {self.loader.worker_timeout:g} s "
                                      f"(pass {self.pass_ + 1}, after {self.read} samples): fix the dataset's "
                                      f"__iter__, or allow more time with --worker-timeout (fit: worker_timeout=)") \
                        from None
                raise
            yield from chunk

    def take(self, n: int) -> List[Any]:
        """Up to ``n`` samples of this pass (fewer where it ends)."""
        if self._it is None:
            return []
        if self.workers or not self._draws:
            out = _next(self._it, n)
        else:
            out = self._reading(lambda: _next(self._it, n))
        self.read += len(out)
        if len(out) < n:
            self.close()
        return out

    def _reading(self, read: Callable[[], List[Any]]) -> List[Any]:
        """``read()`` with the stream's own random states in the generators (while watched,
        noting which of them it moved)."""
        uses = self._draws
        saved = {name: _GENERATORS[name][0]() for name in uses}
        for name in uses:
            _GENERATORS[name][1](self._states[name])
        try:
            return read()
        finally:
            for name in uses:
                state = _GENERATORS[name][0]()
                if self._watch > 0 and not _same_state(state, self._states[name]):
                    self._moved.add(name)
                self._states[name] = state
                _GENERATORS[name][1](saved[name])
            if self._watch > 0:
                self._watch -= 1
                if self._watch == 0:        # the generators it drew from in WATCH reads: only those from now on
                    self._draws = set(self._moved)

    def close(self) -> None:
        workers, self._workers, self._it = self._workers, None, None
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()


def _next(it: Iterator[Any], n: int) -> List[Any]:
    """Up to ``n`` items of ``it`` (the iterator goes on from there)."""
    out = []
    for sample in it:
        out.append(sample)
        if len(out) == n:
            break
    return out
