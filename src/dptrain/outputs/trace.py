"""``--trace FILE.json``: the steps a run traces, written as one Chrome trace file.

The events are recorded by ``core/tracing.py``; rank 0 gathers every process's and writes one
file, which Perfetto (ui.perfetto.dev) or chrome://tracing opens, and ``dptrain plot
--timeline FILE.json -o t.png`` draws without a browser.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ..core.atomic import atomic_file
from ..core.tracing import Tracer, start, stop


def write(path: Union[str, Path], tracers_events: Sequence[List[Dict[str, Any]]]) -> Path:
    """Write every rank's events as one Chrome trace file (atomically)."""
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

    def __init__(self, path: str, steps: int, total_steps: Optional[int], rank: int, names: Sequence[str],
                 collective, log, from_step: int = 3) -> None:
        self.path, self.steps, self.rank, self.names = path, steps, rank, list(names)
        self.collective, self.log = collective, log
        # (counted from 0; total_steps None: not known, an open-ended stream's run)
        self.first = from_step - 1 if total_steps is None else min(from_step - 1, max(0, total_steps - 1))
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
