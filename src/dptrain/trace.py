"""``--trace FILE.json``: where a step's time goes, per device and per process, as a timeline.

For a few steps, every device records its forward and backward, every phase of the gradient
sum (``reduce``, ``sum_and_update``, ``update``...), every bucket's all_reduce (on the
process's ``comm`` track, from its launch to its completion), and the main thread its wait
for the data. The events are Chrome trace events (``ph: "X"``, microseconds), one process per
rank and one track per device; rank 0 gathers them and writes one file, which Perfetto
(ui.perfetto.dev) or chrome://tracing opens, and ``dptrain plot --timeline FILE.json -o t.png``
draws without a browser.

Off (the default), ``span`` costs a function call that returns a shared do-nothing context.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

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


def event(name: str, track: Track, start_us: int, end_us: int) -> None:
    """Record an event whose start and end were taken apart (an all_reduce in flight)."""
    tracer = _current
    if tracer is not None and tracer.active:
        tracer.add(name, track, start_us, end_us)


def now_us() -> int:
    return time.time_ns() // 1000


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


def write(path: Union[str, Path], tracers_events: Sequence[List[Dict[str, Any]]]) -> Path:
    """Write every rank's events as one Chrome trace file (atomically)."""
    from .atomic import atomic_file
    path = Path(path)
    events = [e for part in tracers_events for e in part]
    with atomic_file(path) as f:
        f.write(json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                            "otherData": {"writer": "dptrain", "pid": os.getpid()}}).encode())
    return path


class Window:
    """The steps a run traces: ``steps`` of them from step ``from_step`` (counted from 1; by
    default the third, past the first steps' warm-up; the last step if the run has fewer),
    then the file is written; every process takes part (rank 0 gathers the events and writes).

    >>> window = Window("trace.json", 10, total_steps, rank, names, collective, log, from_step=3)
    >>> for step ...: window.step(step); ...
    >>> window.finish()            # a run shorter than the window: write what there is
    """

    def __init__(self, path: str, steps: int, total_steps: int, rank: int, names: Sequence[str],
                 collective, log, from_step: int = 3) -> None:
        self.path, self.steps, self.rank, self.names = path, steps, rank, list(names)
        self.collective, self.log = collective, log
        self.first = min(from_step - 1, max(0, total_steps - 1))      # counted from 0
        self.tracer: Optional[Tracer] = None
        self.until, self.began, self.traced, self.done = 0, 0, 0, False

    def step(self, step: int) -> None:
        """Called before every step (resumed runs start past ``first``: they trace at once)."""
        if self.done:
            return
        if self.tracer is None and step >= self.first:
            self.tracer = start(self.rank, self.names)
            self.tracer.active = True
            self.until, self.began = step + self.steps, step
        elif self.tracer is not None and step >= self.until:
            self.finish()
        if self.tracer is not None and not self.done:
            self.traced += 1

    def finish(self) -> None:
        if self.tracer is None or self.done:
            return
        tracer = stop()
        self.done = True
        events = self.collective.all_gather_object(tracer.metadata() + tracer.events)
        if self.rank == 0:
            path = write(self.path, events)
            first, last = self.began + 1, self.began + self.traced
            which = f"step {first}" if first == last else f"steps {first}-{last}"
            self.log(f"trace of {which} written to {path} (open it in "
                     f"ui.perfetto.dev, or: dptrain plot --timeline {path} -o timeline.png)")
