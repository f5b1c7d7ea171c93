"""Jobs of several processes (torchrun) that take turns epoch by epoch, one job running at a time.

``turns.py`` does this for variants of one process each, with a condition variable in
shared memory; a torchrun job's workers are grandchildren started by torchrun's agent and
can share nothing of the kind. Here the coordinator (``take_job_turns``, in the benchmark's
process) and each job's workers talk through two named pipes per job:

- each worker, at every ``gate()`` (once before its set-up, then before each epoch's clock),
  writes ``r`` to the job's *ready* pipe and blocks reading a byte from its own *go* pipe (one
  per worker, by ``LOCAL_RANK``: from a shared one, a quick worker could take its slower
  peer's byte too); at the end, ``finish()`` writes ``f`` and blocks until the coordinator
  lets every job leave;
- the coordinator waits until every worker of a job is at its gate (the job's previous turn
  is over), writes a ``g`` to each worker's *go* pipe, waits for them all to be back, then
  does the same for the next job. Waiting on a pipe takes no CPU, so the jobs not in
  their turn do not slow the one that is.

So the jobs start (interpreter, imports) side by side, then: set-up of A, set-up of B, epoch 1
of A, epoch 1 of B, ... Within a job the workers start each epoch together: each waits for
its own ``g``.

    >>> results = take_job_turns({"ddp": cmd_ddp, "dptrain": cmd_dptrain}, workers=2)

where each command runs ``JobGate.from_env()`` (``BENCH_TURNS`` names its pipes) in its workers.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence

ENV = "BENCH_TURNS"             # "<folder>/<job index>": where a worker finds its job's pipes
TIMEOUT_S = 900.0


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR)     # read-write: opening never blocks, reads never see end-of-file


class JobGate:
    """A worker's side: ``gate()`` before the set-up and before each epoch, ``finish()`` at the end."""

    def __init__(self, prefix: str, worker: int):
        self._ready, self._go = _open(prefix + ".ready"), _open(f"{prefix}.go{worker}")

    @classmethod
    def from_env(cls) -> Optional["JobGate"]:
        """The gate ``take_job_turns`` set up for this worker's job (its ``LOCAL_RANK``); None
        if there is none."""
        prefix = os.environ.get(ENV)
        return cls(prefix, int(os.environ.get("LOCAL_RANK", "0"))) if prefix else None

    def gate(self) -> None:
        os.write(self._ready, b"r")
        if os.read(self._go, 1) != b"g":
            raise RuntimeError("the coordinator ended the turns before this job's last epoch")

    def finish(self) -> None:
        """Out of the turns; wait until every job is done (an interpreter's teardown would slow
        another job's last epoch)."""
        os.write(self._ready, b"f")
        os.read(self._go, 1)


class _Job:
    def __init__(self, name: str, cmd: Sequence[str], workers: int, prefix: str, env: Dict[str, str], log: str):
        ends = [".ready"] + [f".go{w}" for w in range(workers)]
        for end in ends:
            os.mkfifo(prefix + end)
        self.name, self.ready = name, _open(prefix + ".ready")
        self.go = [_open(prefix + end) for end in ends[1:]]
        self.log = open(log, "w+")
        # A session of its own: torchrun's workers go with it if it must be killed (killed
        # alone, its workers would wait on their pipe for ever).
        self.proc = subprocess.Popen(list(cmd), env={**env, ENV: prefix}, stdout=self.log, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)

    def send(self, mark: bytes) -> None:
        for go in self.go:
            os.write(go, mark)

    def marks(self, deadline: float) -> bytes:
        """One mark from each worker: ``r`` at a gate or ``f`` finished."""
        got = b""
        workers = len(self.go)
        while len(got) < workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no word from its workers in {TIMEOUT_S:g} s")
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} ended ({self.proc.returncode}) in its turn: {self.tail()}")
            if select.select([self.ready], [], [], 1.0)[0]:
                got += os.read(self.ready, workers - len(got))
        return got

    def tail(self) -> str:
        self.log.seek(0)
        text = self.log.read()
        first = text.find("Traceback")          # the first worker's traceback, not torchrun's own
        return text[first:first + 2500] if first >= 0 else text[-2500:]


def take_job_turns(commands: Dict[str, Sequence[str]], workers: int,
                   env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Run the commands (each a job of ``workers`` processes that use ``JobGate``) taking turns
    (see the module docstring); returns each job's output. A job that fails raises here."""
    with tempfile.TemporaryDirectory() as tmp:
        jobs: List[_Job] = [_Job(name, cmd, workers, os.path.join(tmp, str(k)), env or dict(os.environ),
                                 os.path.join(tmp, f"{k}.log")) for k, (name, cmd) in enumerate(commands.items())]
        try:
            deadline = time.monotonic() + TIMEOUT_S
            at_gate = [job.marks(deadline) for job in jobs]       # started side by side
            active = list(range(len(jobs)))
            while active:
                for k in list(active):
                    if set(at_gate[k]) == {ord("f")}:
                        active.remove(k)
                        continue
                    if set(at_gate[k]) != {ord("r")}:
                        raise RuntimeError(f"{jobs[k].name}: its workers disagree on the epochs left "
                                           f"({at_gate[k].decode()})")
                    jobs[k].send(b"g")
                    at_gate[k] = jobs[k].marks(time.monotonic() + TIMEOUT_S)
            for job in jobs:
                job.send(b"x")      # every job may leave now
            outputs = {}
            for job in jobs:
                if job.proc.wait(timeout=120) != 0:
                    raise RuntimeError(f"{job.name} failed ({job.proc.returncode}): {job.tail()}")
                job.log.seek(0)
                outputs[job.name] = job.log.read()
            return outputs
        finally:
            for job in jobs:
                if job.proc.poll() is None:
                    os.killpg(job.proc.pid, signal.SIGKILL)
                    job.proc.wait()
                job.log.close()
                for fd in [job.ready] + job.go:
                    os.close(fd)
