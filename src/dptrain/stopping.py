"""Stopping a run between batches, at the same batch in every process.

SIGINT and SIGTERM do not stop the run where they land: they are noted, and the loop
stops at the next batch boundary, after saving. With several processes the signal may
reach one process, or all of them a few batches apart, and a non-finite loss may appear in
one process only; so after every batch the processes sum three flags (SIGINT seen, SIGTERM
seen, non-finite loss seen) in one small message, and all of them act on the same answer.
With one process nothing is sent.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch

from .distributed.collective import Collective

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """Note SIGINT/SIGTERM while ``catching()``; ``agree()`` after each batch says what to do.

    >>> stops = StopRequests(get_collective())
    >>> with stops.catching():
    ...     for batch in batches:
    ...         loss = step(batch)
    ...         signum, non_finite = stops.agree(not torch.isfinite(loss))
    ...         if signum is not None:
    ...             save(); break
    """

    def __init__(self, collective: Collective):
        self.collective = collective
        self.signum: Optional[int] = None

    @contextmanager
    def catching(self) -> Iterator[None]:
        """Note SIGINT/SIGTERM instead of dying (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def note(signum, _frame):
            self.signum = signum
        before = {s: signal.signal(s, note) for s in SIGNALS}
        try:
            yield
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)

    def agree(self, non_finite: bool) -> Tuple[Optional[int], bool]:
        """``(signal to stop for or None, whether any process saw a non-finite loss)``.

        Every process gets the same answer: a stop requested in any of them stops all
        (SIGTERM wins over SIGINT when both were seen).
        """
        if self.collective.world_size == 1:
            return self.signum, non_finite
        device = getattr(self.collective, "device", torch.device("cpu"))
        flags = torch.tensor([float(self.signum == s) for s in SIGNALS] + [float(non_finite)], device=device)
        seen_int, seen_term, any_non_finite = self.collective.all_reduce(flags).tolist()
        signum = signal.SIGTERM if seen_term else signal.SIGINT if seen_int else None
        return signum, bool(any_non_finite)

    def barrier(self) -> None:
        """Wait until every process gets here (after rank 0 saved, before anyone leaves)."""
        if self.collective.world_size > 1:
            device = getattr(self.collective, "device", torch.device("cpu"))
            self.collective.all_reduce(torch.zeros(1, device=device))
