"""Every process of a job beats once a second; one that stops is named, and the job ends.

A worker stopped (SIGSTOP), frozen or killed leaves the others waiting in a collective until
its timeout, and the healthy process that times out first gets the blame. Here each process
runs a thread that adds 1 to its own counter in the rendezvous store every second and reads
everyone's: a counter that has not moved for ``timeout_s`` means that process is not
running, and every process that sees it prints one line naming it and exits (code 1), well
before the collectives' own, longer timeout. A process that finishes marks itself done.
The threads beat whatever the main thread does, so a slow step or a long save is not a hang.

A silent process on the same machine is also killed (SIGKILL) by the one that names it: it is
stopped or frozen, the job cannot go on with it, and the elastic agent waits for a process
that ignores its SIGTERM (a stopped one does) a long grace period before it restarts the group.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Dict

import torch.distributed as dist

from .env import store_key
from .worker import record_error

INTERVAL_S = 1.0
HUNG_EXIT = 1




class Heartbeat(threading.Thread):
    """Beat for ``rank`` and watch the other ``world - 1`` ranks; see the module docstring.

    >>> beat = Heartbeat(rank, world, timeout_s=60).start()
    >>> ...                                  # train
    >>> beat.stop()                          # done: the others stop watching this rank
    """

    runs = 0        # heartbeats this process started: every process starts them in the same order

    def __init__(self, rank: int, world: int, timeout_s: float, on_hang=None):
        super().__init__(name="dptrain-heartbeat", daemon=True)
        Heartbeat.runs += 1
        self.run_id = Heartbeat.runs        # keys of its own: an earlier run's "done" mark stays its own
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.on_hang = on_hang or _exit_naming
        self._stop_event = threading.Event()
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        # A connection of its own: the main thread's store traffic never waits behind it.
        self.store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
        self.store.set(self._key(f"pid/{rank}"), f"{socket.gethostname()} {os.getpid()}")

    def _key(self, name: str) -> str:
        return store_key(f"run{self.run_id}/{name}")

    def start(self) -> "Heartbeat":
        super().start()
        return self

    def run(self) -> None:
        seen: Dict[int, int] = {}
        moved: Dict[int, float] = {r: time.monotonic() for r in range(self.world) if r != self.rank}
        while not self._stop_event.wait(INTERVAL_S):
            try:
                self.store.add(self._key(f"beat/{self.rank}"), 1)
                now = time.monotonic()
                for r in list(moved):
                    count = int(self.store.add(self._key(f"beat/{r}"), 0))
                    if count < 0:           # done (see stop)
                        del moved[r]
                    elif count != seen.get(r):
                        seen[r], moved[r] = count, now
                    elif now - moved[r] > self.timeout_s:
                        why = f"no heartbeat for {self.timeout_s:g} s"
                        # Named before it is killed: the agent may see that rank end before this one
                        # (the launcher then reads the blame here; it reported the rank killed).
                        record_error(_hang_line(r, self.world, why), blames=r)
                        self._kill_if_here(r)
                        return self.on_hang(r, self.world, why)
            except RuntimeError:        # the store itself does not answer: rank 0 (its host) is gone
                if self._stop_event.is_set():
                    return
                host = "the torchrun agent" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "rank 0"
                return self.on_hang(0, self.world, f"the rendezvous store {host} hosts did not answer within "
                                                   f"{self.timeout_s:g} s")

    def _kill_if_here(self, rank: int) -> None:
        try:
            host, pid = self.store.get(self._key(f"pid/{rank}")).decode().split()
            if host == socket.gethostname():
                os.kill(int(pid), signal.SIGKILL)
        except (RuntimeError, ValueError, OSError):
            pass

    def stop(self) -> None:
        """This process is done: say so, and stop beating."""
        self._stop_event.set()
        try:
            self.store.add(self._key(f"beat/{self.rank}"), -(10**12))     # far below zero: done, whatever it counted
        except RuntimeError:
            pass
        self.join(timeout=2 * INTERVAL_S)


def _hang_line(rank: int, world: int, why: str) -> str:
    return (f"dptrain: error: rank {rank} of {world} stopped answering ({why}): it is stopped, frozen or dead; "
            f"ending this process too (--timeout sets the wait)")


def _exit_naming(rank: int, world: int, why: str) -> None:
    line = _hang_line(rank, world, why)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    record_error(line, blames=rank)
    os._exit(HUNG_EXIT)
