"""``max_steps``: a run that ends after a number of updates, mid-epoch if that is where they end.

(``max_time``, ``time_limit.py``, ends an epoch mid-way the same way: a ``Cut``.)

As Lightning's and Hugging Face's ``max_steps``: the schedules of language-model training
are counted in updates, not epochs. The epoch the limit ends is evaluated and saved like any
other, its row covering the batches it trained (``batches``, ``samples``). Its checkpoint is
the mid-epoch kind, holding that row too: a run resumed with a larger ``max_steps`` (or none)
drops the row and trains the rest of that epoch, so it ends exactly as a run given the larger
limit from the start (the callbacks' states and the random streams are those of the moment
the limit was reached, before the evaluation); resumed with the same limit it has nothing
left to do.
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from .resume import Position, random_states


def epochs_for(max_steps: int, batches: Optional[int]) -> int:
    """The epochs ``max_steps`` updates need (the last one perhaps in part). An open-ended
    stream's epochs (``batches`` None) have no length known before: then ``max_steps``, a
    bound (an epoch trains a batch at least) the run's last update ends before."""
    if batches is None:
        return max_steps
    return max(1, -(-max_steps // max(batches, 1)))


def steps_done(position: Position, batches: Optional[int], saved: Optional[int] = None) -> int:
    """Updates a run at ``position`` has made: full epochs before it, then its batches (an
    open-ended stream's epochs: the count its checkpoint ``saved``)."""
    if batches is None:
        return saved or 0
    return (position.epoch - 1) * batches + position.batch


class StepLimit:
    """Where ``max_steps`` ends a run (None: no limit)."""

    def __init__(self, max_steps: Optional[int]):
        self.max_steps = max_steps

    def reached(self, steps: int) -> bool:
        """Whether a run that has made ``steps`` updates has made its updates already."""
        return self.max_steps is not None and steps >= self.max_steps

    def last_batch(self, steps_before: int, batches: Optional[int]) -> int:
        """The last batch an epoch of ``batches`` (None: open-ended) after ``steps_before``
        updates may train (all of them when the limit is further)."""
        most = batches if batches is not None else sys.maxsize
        if self.max_steps is None:
            return most
        return max(0, min(most, self.max_steps - steps_before))

    def left(self, steps: int, epoch: int, epochs: int, batches: Optional[int]) -> Tuple[Optional[int], int]:
        """``(updates, epoch ends)`` a run at ``steps`` updates, in ``epoch`` of ``epochs``, has
        left at most (``max_time`` or a stop may end it before; updates None: an open-ended
        stream's, not known)."""
        last = epochs if self.max_steps is None or batches is None else min(epochs, epochs_for(self.max_steps, batches))
        if batches is None:
            return (None if self.max_steps is None else max(0, self.max_steps - steps)), max(0, last - epoch + 1)
        total = epochs * batches if self.max_steps is None else min(epochs * batches, self.max_steps)
        return max(0, total - steps), max(0, last - epoch + 1)

    def reason(self, batch: int, batches: Optional[int]) -> str:
        return f"max_steps {self.max_steps} reached at batch {batch}" + (f" of {batches}" if batches else "")


def ends_here(run: Any, epoch: int, batch: int, steps: int, part_way: bool, so_far: Callable[[int], Position]) -> bool:
    """After ``batch`` batches of ``epoch``, ``steps`` updates in all: whether ``max_steps`` or
    ``max_time`` ends the run here (said in ``run.stop_reason``). Part-way through the epoch,
    ``run.cut`` keeps what a resumed run needs (``so_far``: the position then)."""
    limited = run.limit.reached(steps)
    if not ((limited or run.timed_out) and (part_way or epoch < run.epochs)):
        return False
    of = f" of {run.batches}" if run.batches else ""
    reason = run.limit.reason(batch, run.batches) if limited else run.clock.reason(f"at batch {batch}{of}")
    run.stop_reason = run.stop_reason or reason
    if part_way:
        saving = run.config.checkpoint_dir is not None
        run.cut = Cut(so_far(batch), run.callbacks.state_dict() if saving else {},
                      random_states(run) if saving else {}, "max_steps" if limited else "max_time")
    return True


class Cut:
    """What a run keeps when ``max_steps`` (or ``max_time``: the ``cause``) ends an epoch after
    ``position.batch`` batches: the position (with this process's partial sums), the callbacks'
    states and every process's random states (``resume.random_states``), taken before the
    evaluation and the epoch's hooks."""

    def __init__(self, position: Position, callbacks: Dict[str, Any], random: Dict[str, Any],
                 cause: str = "max_steps"):
        self.position, self.callbacks, self.random = position, copy.deepcopy(callbacks), random
        self.cause = cause


def resume_cut(run: Any, state: Dict[str, Any], position: Position) -> Position:
    """A checkpoint ``max_steps`` or ``max_time`` saved mid-epoch (its history has that
    epoch's row), ``run.step`` updates in: go on with the rest of the epoch if this run trains
    further (the row is dropped, the callbacks get their states of the moment of the cut),
    else start past it (nothing to train)."""
    if not (run.history and run.history[-1]["epoch"] == position.epoch and position.batch):
        return position
    goes_on = (run.config.max_steps is None or run.config.max_steps > run.step) and position.epoch <= run.epochs
    if not goes_on:
        return Position(position.epoch + 1)
    run.history.pop()
    if state.get("callbacks_at_cut") is not None:
        run.callbacks.load_state_dict(state["callbacks_at_cut"])
    cause = state.get("cut_cause", "max_steps")
    run.log(f"resuming: epoch {position.epoch} ended after batch {position.batch} ({cause}); it goes on from there, "
            f"and its row is made again")
    return position
