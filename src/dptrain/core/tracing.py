"""Recording where a step's time goes: spans per device, per process (``--trace``'s events).

For a few steps, every device records its forward and backward, every phase of the gradient
sum (``reduce``, ``sum_and_update``, ``update``...), every bucket's all_reduce (on the
process's ``comm`` track, from its launch to its completion), and the main thread its wait
for the data. The events are Chrome trace events (``ph: "X"``, microseconds), one process per
rank and one track per device. ``outputs/trace.py`` decides which steps are recorded and
writes the file.

Off (the default), ``span`` costs a function call that returns a shared do-nothing context.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Union

Track = Union[int, str]
_NULL = contextlib.nullcontext()


class Tracer:
    """Collects events while ``active``; see the module docstring."""

    def __init__(self, rank: int, names: Sequence[str]):
        self.rank, self.names = rank, list(names)
        self.events: List[Dict[str, Any]] = []
        self.active = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _span(self, name: str, track: Track, args: Optional[Dict[str, Any]]) -> Iterator[None]:
        start = time.time_ns() // 1000
        try:
            yield
        finally:
            self.add(name, track, start, time.time_ns() // 1000, args)

    def add(self, name: str, track: Track, start_us: int, end_us: int, args: Optional[Dict[str, Any]] = None) -> None:
        event = {"name": name, "cat": name.split(" ")[0], "ph": "X", "ts": start_us, "dur": max(end_us - start_us, 0),
                 "pid": self.rank, "tid": track if isinstance(track, int) else 1000 + ["main", "comm"].index(track)}
        if args:
            event["args"] = args
        with self._lock:
            self.events.append(event)

    def metadata(self) -> List[Dict[str, Any]]:
        names = {i: f"{name}" for i, name in enumerate(self.names)}
        names.update({1000: "main (data)", 1001: "comm (all_reduce)"})
        out = [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}}]
        out += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": t, "args": {"name": n}}
                for t, n in names.items()]
        out += [{"name": "thread_sort_index", "ph": "M", "pid": self.rank, "tid": t, "args": {"sort_index": t}}
                for t in names]
        return out


_current: Optional[Tracer] = None


def span(name: str, track: Track, args: Optional[Dict[str, Any]] = None):
    """A context that records ``name`` on ``track`` (a device index, ``"main"`` or
    ``"comm"``) while tracing is on; a shared do-nothing context otherwise."""
    tracer = _current
    if tracer is None or not tracer.active:
        return _NULL
    return tracer._span(name, track, args)


def recording() -> bool:
    """Whether spans are being recorded now."""
    return _current is not None and _current.active


def event(name: str, track: Track, start_us: int, end_us: int) -> None:
    """Record an event whose start and end were taken apart (an all_reduce in flight)."""
    tracer = _current
    if tracer is not None and tracer.active:
        tracer.add(name, track, start_us, end_us)


def now_us() -> int:
    return time.time_ns() // 1000


def timed_batches(batches: Iterable[Any]) -> Iterator[Any]:
    """The batches, with the wait for each recorded as ``data`` on the main track (``--trace``)."""
    it = iter(batches)
    while True:
        begun = now_us()
        try:
            batch = next(it)
        except StopIteration:
            return
        event("data", "main", begun, now_us())
        yield batch


def start(rank: int, names: Sequence[str]) -> Tracer:
    """Begin collecting (the loop calls it for the traced steps)."""
    global _current
    _current = Tracer(rank, names)
    return _current


def stop() -> Optional[Tracer]:
    global _current
    tracer, _current = _current, None
    if tracer is not None:
        tracer.active = False
    return tracer


