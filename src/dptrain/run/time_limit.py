"""``max_time``: a run that ends after a length of wall-clock time (a job's time limit), resumable.

As Lightning's ``max_time``: a cluster job granted 12 hours trains for 11:45 and ends well,
instead of being killed mid-write. The clock starts when the run does (set-up counted: it is
the job's time) and is read after every batch and after every epoch. With several processes
each reads its own clock, and the first to pass the limit stops all of them after the same
batch: its flag rides with the gradients, as a SIGTERM's does (``stopping.py``). An epoch the
limit ends mid-way is evaluated and saved as one ``max_steps`` ends (``step_limit.Cut``): a
run resumed (``resume=True``, with a fresh ``max_time``) drops that row and trains the rest
of the epoch, ending as the unbroken run would, bit for bit on a CPU.

A job whose workers are started again within it (``--max-restarts``) has one time limit, not
one per start: ``dptrain launch``/``--processes`` writes the job's start in
``DPTRAIN_JOB_START`` (seconds since the epoch, as ``date +%s`` gives; ``distributed/env.py``),
which the workers, restarted ones too, inherit and count from. A job script may set it first (say, at the top of
a Slurm batch script, so the time before the launch counts too); a run started without it
counts from its own start.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from ..distributed.env import job_elapsed

#: The clock (tests replace it, to end a run at a batch of their choosing).
now: Callable[[], float] = time.monotonic


def said(seconds: float) -> str:
    """``3725.0`` -> ``1:02:05``; under a minute, ``2.5 s``."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}"


class TimeLimit:
    """Whether ``seconds`` have passed since the run (or the job it is part of) started
    (never, for None)."""

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds
        #: how long the job ran before this run started (DPTRAIN_JOB_START; 0 without it)
        self.before = job_elapsed() if seconds is not None else 0.0
        self.start = now() - self.before

    def up(self) -> bool:
        return self.seconds is not None and now() - self.start >= self.seconds

    def counted_from(self) -> Optional[str]:
        """The line saying the limit counts from the job's start, when it does."""
        if not self.before:
            return None
        return (f"dptrain: max_time {said(self.seconds)} counts from the job's start (DPTRAIN_JOB_START), "
                f"{said(self.before)} ago: {said(max(0.0, self.seconds - self.before))} left")

    def reason(self, where: str) -> str:
        return f"max_time {said(self.seconds)} reached {where}"
