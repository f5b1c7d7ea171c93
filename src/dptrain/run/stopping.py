"""Stopping a run between batches, at the same batch in every process.

SIGINT and SIGTERM do not stop the run where they land: they are noted, and the loop
stops at a batch boundary, after saving. With several processes the signal may reach one
process, or all of them a few batches apart, and a non-finite loss may appear in one
process only, a callback may ask one process to stop (``run.stop``), and one process's
clock may pass ``max_time`` first (``time_limit.py``); so the processes sum five flags
(SIGINT seen, SIGTERM seen, non-finite loss seen, stop asked, time up) and all of them act on
the same answer. The flags ride with the gradients: those
seen before batch b go in b's last gradient bucket (``Trainer.step_with(extras=...)``), and
their sum is read after it, so they cost no message of their own (a separate 12-byte gloo
all_reduce took ~1.2 ms of latency here, sent asynchronously still 0.1-0.3 ms a step). So
with several processes a stop lands one batch later than with one process, where nothing
is sent.
"""
from __future__ import annotations

import collections
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Deque, Iterator, NamedTuple, Optional, Tuple

import torch

from ..core.errors import Interrupted, NonFiniteLoss
from ..distributed.collective import Collective
from ..outputs.checkpoint import checkpoint_path
from ..parallel.sync.base import Extras
from .resume import Position, save_mid_epoch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Decision(NamedTuple):
    """What every process does after a batch: stop for ``signum`` (saving first), stop for
    the non-finite loss of ``bad_batch``, end the run as a callback asked (``requested``), or
    end it because ``max_time`` is up (``time_up``: resumable from there)."""
    signum: Optional[int] = None
    bad_batch: Optional[int] = None
    requested: bool = False
    time_up: bool = False


GO_ON = Decision()          # the answer of almost every batch, made once


def say_at_once(line: str) -> None:
    """Write ``line`` to stderr from a signal handler: one ``os.write``, not ``print``. A
    handler runs between any two bytecodes of the main thread, and inside a ``print`` to
    stderr that the signal interrupted, where a second ``print`` fails ("reentrant call")
    or mixes its text into the first's."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):      # a stream without a file (captured)
        print(line, file=sys.stderr, flush=True)
        return
    try:
        os.write(fd, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


class StopRequests:
    """Note SIGINT/SIGTERM while ``catching()``; around each batch, decide with the others.

    >>> stops = StopRequests(get_collective())
    >>> with stops.catching():
    ...     for b, batch in enumerate(batches, 1):
    ...         flags = stops.before_batch()               # None with one process
    ...         loss = step(batch, extras=flags)           # summed with the gradients
    ...         decision = stops.after_batch(b, not torch.isfinite(loss), summed_flags)
    ...         if decision.bad_batch is not None: raise ...
    ...         if decision.signum is not None: save(); break
    ...     decision = stops.flush()                       # what the last batch saw
    """

    def __init__(self, collective: Collective, announce: Optional[Callable[[str], None]] = None,
                 saving: Optional[str] = None):
        """``announce``: where to say at once that a signal was heard (None: say nothing);
        ``saving``: the checkpoint folder a stop saves to, if any."""
        self.collective, self.announce, self.saving = collective, announce, saving
        self.device = getattr(collective, "device", torch.device("cpu"))   # where its messages live
        self.signum: Optional[int] = None
        self._bad = False                                # a non-finite loss here, not yet shared
        self._requested = False                          # a callback asked to stop
        self._time_up = False                            # this process's clock passed max_time
        self._batch = 0                                  # the last batch done
        self._sent: Deque[Tuple[float, ...]] = collections.deque()   # flags given to batches not yet decided on

    @contextmanager
    def catching(self) -> Iterator[None]:
        """Note SIGINT/SIGTERM instead of dying (main thread only; elsewhere a no-op).

        The first is answered at once and acted on after the batch; a second stops now,
        without saving (``KeyboardInterrupt``)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def note(signum, _frame):
            if self.signum is not None:
                raise KeyboardInterrupt("stopped now, without saving")
            self.signum = signum
            if self.announce is not None:
                name = signal.Signals(signum).name
                where = f" and saving to {self.saving}" if self.saving else \
                    " (no checkpoint directory: nothing is saved)"
                again = "Ctrl-C" if signum == signal.SIGINT else name
                self.announce(f"dptrain: {name}: stopping after this batch{where}; {again} again to stop now "
                              f"without saving")
        before = {s: signal.signal(s, note) for s in SIGNALS}
        try:
            yield
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)

    @property
    def _shared(self) -> bool:
        return self.collective.world_size > 1

    def request(self) -> None:
        """A callback asks the run to stop: every process hears it with the next flags."""
        self._requested = True

    def time_up(self) -> None:
        """``max_time`` has passed on this process's clock: every process hears it with the
        next flags."""
        self._time_up = True

    def _flags(self) -> Tuple[float, ...]:
        """Python numbers, not a tensor: the gradients' last bucket writes them with its
        counts in one copy (a tensor: 1-2 operations to make it, 3 to write it; each a
        kernel on a GPU)."""
        flags = tuple(float(self.signum == s) for s in SIGNALS) + (float(self._bad), float(self._requested),
                                                                  float(self._time_up))
        self._bad = False
        return flags

    def before_batch(self) -> Optional[Tuple[float, ...]]:
        """What this process saw so far, to send with the next batch's gradients (several
        processes; None with one): five numbers."""
        if not self._shared:
            return None
        self._sent.append(self._flags())
        return self._sent[-1]

    def after_batch(self, batch: int, non_finite: bool, received: Extras = None) -> Decision:
        """The decision every process takes after ``batch``.

        One process: about this batch. Several: about what the processes saw up to the batch
        before, ``received`` (the sum of the flags every process gave ``before_batch``; None
        if they could not ride with the gradients: then they are sent now). What is seen now
        goes with the next batch, or with ``flush``.
        """
        self._batch = batch
        if not self._shared:
            if self.signum is None and not non_finite and not self._requested and not self._time_up:
                return GO_ON
            return Decision(self.signum, batch if non_finite else None, self._requested, self._time_up)
        self._bad = self._bad or non_finite
        if not self._sent:
            return GO_ON
        sent = self._sent.popleft()
        if received is None:
            received = self.collective.all_reduce(torch.tensor(sent, device=self.device))
        return self._decide(received, batch - 1)

    def flush(self) -> Decision:
        """After the last batch of an epoch: share what it saw and decide (a blocking message)."""
        if not self._shared:
            return Decision(self.signum, None, self._requested, self._time_up)
        return self._decide(self.collective.all_reduce(torch.tensor(self._flags(), device=self.device)), self._batch)

    def agree(self) -> Tuple[bool, bool]:
        """After an epoch's callbacks: whether any process's callback asked to stop, and
        whether any process's ``max_time`` is up (one small message with several processes)."""
        if not self._shared:
            return self._requested, self._time_up
        asked, late = self.collective.all_reduce(torch.tensor([float(self._requested), float(self._time_up)],
                                                               device=self.device)).tolist()
        return bool(asked), bool(late)

    @staticmethod
    def _decide(flags: Extras, flagged_batch: int) -> Decision:
        seen_int, seen_term, any_bad, requested, late = (flags.tolist() if isinstance(flags, torch.Tensor)
                                                         else flags)[:5]
        signum = signal.SIGTERM if seen_term else signal.SIGINT if seen_int else None
        return Decision(signum, flagged_batch if any_bad else None, bool(requested), bool(late))

    def barrier(self) -> None:
        """Wait until every process gets here (after rank 0 saved, before anyone leaves)."""
        if self._shared:
            self.collective.all_reduce(torch.zeros(1, device=self.device))


def act_on(run: Any, decision: Decision, epoch: int, batch: int, so_far: Callable[[int], Position],
           resolve: Callable[[int, int], None]) -> bool:
    """Act on what every process decided after ``batch`` (the last batch done): go on
    (False), end the epoch as a callback asked (True), stop for NaN, or save and stop."""
    directory = run.config.checkpoint_dir
    if decision.bad_batch is not None:
        kept = f"; the last good checkpoint is kept in {directory}" if directory else ""
        raise NonFiniteLoss(f"the loss became NaN or infinite at epoch {epoch}, batch {decision.bad_batch}: "
                            f"lower --lr, or pass --on-nan skip to skip such batches (a batch whose targets "
                            f"are all ignore_index, or weigh 0 in all, has a NaN mean, as in PyTorch){kept}")
    if decision.signum is None:
        if decision.time_up:
            run.timed_out = True
        return decision.requested or decision.time_up
    resolve(0, batch)           # what the steps still in flight say, before a save
    save_mid_epoch(run, so_far(batch))
    run.stops.barrier()         # nobody leaves (and gets the others stopped) before the save
    name = signal.Signals(decision.signum).name
    where = (f"; saved to {checkpoint_path(directory)}: continue with --resume" if directory
             else " (no --checkpoint-dir: nothing saved)")
    raise Interrupted(f"stopped by {name} at epoch {epoch}, batch {batch}{where}")
