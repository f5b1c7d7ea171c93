"""Start N local worker processes for one job and watch them: ``dptrain train --processes N``.

Every worker is ``python -m dptrain train ...`` (or the user's script, for ``dptrain
launch``) with torchrun's variables set (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port)
and an equal share of the CPU cores (OMP_NUM_THREADS). Rank 0 writes to the terminal; the
others' output is kept. If any worker fails or is killed, the others are stopped (SIGTERM,
then SIGKILL after a grace period), the failed rank and the end of its error are reported,
and the launcher exits non-zero. Workers die with the launcher (PR_SET_PDEATHSIG) and run in
their own process groups, so no process is left behind.

SIGINT (Ctrl-C) or SIGTERM to the launcher is passed on to every worker, and the workers get
time to finish their batch and save (they agree to stop at the same batch, see
``stopping.py``); a worker that exits with 130 (interrupted) is not a failure.
"""
from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Deque, List, Optional, Sequence

from ..devices import host_cores

GRACE_S = 5.0
INTERRUPT_GRACE_S = 120.0     # workers finish the batch and write the checkpoint
INTERRUPTED = 130
TAIL_LINES = 30


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _death_signal():
    """A function for the child to run before exec: die with SIGKILL if the launcher dies.

    libc is loaded here, in the parent: the child may only make the system call (importing
    in a child forked from a threaded parent can deadlock)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)       # 1 = PR_SET_PDEATHSIG


class _Worker:
    def __init__(self, rank: int, proc: subprocess.Popen):
        self.rank, self.proc = rank, proc
        self.tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.reader: Optional[threading.Thread] = None

    def read(self, echo: bool) -> None:
        for line in self.proc.stderr:
            self.tail.append(line.rstrip("\n"))
            if echo:
                sys.stderr.write(line)
                sys.stderr.flush()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def launch(command: Sequence[str], processes: int, port: Optional[int] = None,
           env: Optional[dict] = None) -> int:
    """Run ``python <command>`` (``["-m", "dptrain", "train", ...]``, ``["train.py", ...]``) as
    ``processes`` ranks; return the exit code."""
    if processes < 1:
        raise ValueError(f"--processes must be at least 1, got {processes}")
    port = port or free_port()
    threads = max(1, host_cores() // processes)
    workers: List[_Worker] = []
    before_exec = _death_signal()
    for rank in range(processes):
        child_env = dict(os.environ if env is None else env)
        child_env.update({
            "RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": str(threads), "DPTRAIN_LAUNCHED": "1",
        })
        if sys.platform.startswith("linux"):
            child_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        proc = subprocess.Popen(
            [sys.executable, *command], env=child_env,
            stdout=None if rank == 0 else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=before_exec)
        worker = _Worker(rank, proc)
        worker.reader = threading.Thread(target=worker.read, args=(rank == 0,), daemon=True)
        worker.reader.start()
        workers.append(worker)
    return _watch(workers)


class _Signalled(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_on(signum, _frame):
    raise _Signalled(signum)


def _stop(workers: Sequence[_Worker], sig: int = signal.SIGTERM, grace: float = GRACE_S) -> None:
    for w in workers:
        if w.proc.poll() is None:
            try:
                os.killpg(w.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            w.proc.wait()


def _watch(workers: List[_Worker]) -> int:
    failed: Optional[_Worker] = None
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, _raise_on) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        while True:
            codes = [w.proc.poll() for w in workers]
            failed = next((w for w, c in zip(workers, codes) if c not in (None, 0, INTERRUPTED)), None)
            if failed is not None or all(c is not None for c in codes):
                break
            time.sleep(0.05)
    except _Signalled as e:
        name = signal.Signals(e.signum).name
        print(f"dptrain: {name}: the workers stop after this batch (saving, with --checkpoint-dir); "
              f"{'Ctrl-C' if e.signum == signal.SIGINT else name} again to stop now without saving",
              file=sys.stderr, flush=True)
        try:
            _stop(workers, e.signum, INTERRUPT_GRACE_S)
        except _Signalled as again:      # the second one: the workers stop at once
            _stop(workers, again.signum, GRACE_S)
            print("dptrain: stopped now, without saving", file=sys.stderr)
            return INTERRUPTED
        print(f"dptrain: {name}: all workers stopped", file=sys.stderr)
        return INTERRUPTED
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if failed is None:
        for w in workers:
            w.reader.join(timeout=5)
        return INTERRUPTED if any(w.proc.returncode == INTERRUPTED for w in workers) else 0
    _stop([w for w in workers if w is not failed])
    failed.reader.join(timeout=5)
    print(_report(failed, len(workers)), file=sys.stderr)
    return 1


def _report(failed: _Worker, world: int) -> str:
    """One line for a failed worker: its own error line if it wrote one (rank 0's is on the
    terminal already), else its exit and the end of its output."""
    how = f"rank {failed.rank} of {world}, {_describe(failed.proc.returncode)}"
    said = [line for line in failed.tail if line.startswith("dptrain: error: ")]
    if said and failed.rank == 0:
        return f"dptrain: stopped the other workers ({how})"
    if said:
        return f"{said[-1]} ({how}); stopped the other workers"
    detail = "\n".join(f"  [rank {failed.rank}] {line}" for line in failed.tail) if failed.rank else ""
    return (f"dptrain: error: rank {failed.rank} of {world} failed ({_describe(failed.proc.returncode)}); "
            f"stopped the other workers" + (f". Its last output:\n{detail}" if detail else ""))
