"""Batches read one ahead, so the loop knows a batch is an epoch's last as it trains it.

An open-ended stream (``stream_loader.py``: no ``__len__``, no ``steps_per_epoch``) says where
its epoch ends only by ending. The loop needs it a batch earlier: the last batch of an epoch
is not a place to save mid-epoch, and ``max_steps`` or ``max_time`` landing on it ends the
epoch whole, not part-way. So the next batch is read before this one is trained, as a
``DataLoader``'s prefetching does anyway.

    >>> batches = Lookahead(loader.batches())
    >>> for batch in batches:
    ...     train(batch)
    ...     if batches.ended: ...           # the epoch ends with this batch

A failure reading the next batch is raised when that batch's turn comes, not before this one
trains: the error names the batch it was reading, and no work is lost to it.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

_END = object()


class _Failed:
    def __init__(self, error: Exception):
        self.error = error


class Lookahead:
    """Iterate over ``batches`` with ``ended``: whether they end with the batch given last
    (or, none given, are none)."""

    def __init__(self, batches: Iterable[Any]):
        self._it: Iterator[Any] = iter(batches)
        self.ended = False
        self._next: Any = None
        self._pending = False           # the first batch is read when it is asked for

    def __iter__(self) -> "Lookahead":
        return self

    def __next__(self) -> Any:
        item = self._next if self._pending else self._read()
        if item is _END:
            self.ended = True
            raise StopIteration
        if isinstance(item, _Failed):
            raise item.error
        self._next, self._pending = self._read(), True
        self.ended = self._next is _END
        return item

    def _read(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            return _END
        except Exception as e:     # noqa: BLE001 - raised in its turn (see the module docstring)
            return _Failed(e)
