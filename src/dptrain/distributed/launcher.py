"""Start a job's workers on torchrun's elastic agent, and say in one line how it ended.

``dptrain train --processes N`` and ``dptrain launch --processes N script.py`` hand the work
to ``torch.distributed.launcher.api.elastic_launch``, the agent behind ``torchrun``: it
rendezvouses (c10d, on a free port, or ``--rdzv-endpoint`` for several machines), starts
and watches the workers, passes SIGINT/SIGTERM on to them, and on a failure stops the group
and, with ``--max-restarts K``, starts it again (the workers then resume from the last
checkpoint by themselves, see ``train.py``). What stays here is the glue: the settings
(every ``LaunchConfig`` field we rely on is set, since its defaults differ between torch
versions and from torchrun's command line), the cores per worker, and one line for a failed
job naming the rank, its exit code or signal, and its last error line.

Workers write their one-line error to the file the agent gives them (``TORCHELASTIC_ERROR_
FILE``, where ``@record`` would put a traceback) and die with the agent (``PR_SET_PDEATHSIG``),
so nothing is left behind. Local rank 0 writes to the terminal; the others to log files,
whose last lines are shown when such a worker fails without saying why.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, Optional, Sequence, Tuple

from ..core.devices import host_cores
from .env import DEFAULT_TIMEOUT_S, check_host, mark_job_start
from .join import listening

INTERRUPTED = 130
#: How long the agent lets workers finish their batch and save after SIGINT/SIGTERM.
INTERRUPT_GRACE_S = 120
TAIL_LINES = 20
#: The rendezvous port when --rdzv-endpoint names none (torchrun's).
RDZV_PORT = 29400


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_nnodes(text: str):
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4) (an elastic job: it goes on with fewer machines)."""
    try:
        low, _, high = str(text).partition(":")
        low, high = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"--nnodes {text!r}: give a number of machines N, or MIN:MAX") from None
    if not 1 <= low <= high:
        raise ValueError(f"--nnodes {text!r}: need 1 <= MIN <= MAX")
    return low, high


def quiet_agent() -> None:
    """The agent's own log lines off (we say what matters): each of its modules' loggers
    has a level of its own (torch sets it from ``LOGLEVEL``), so the parent's is not enough."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def check_endpoint(endpoint: Optional[str], nnodes: str) -> Optional[Tuple[str, int]]:
    """Several machines meet at ``--rdzv-endpoint HOST[:PORT]``: it must be given, and its host
    must resolve (the engine would retry a name that does not for minutes). Returns (host, port)."""
    if endpoint is None:
        if parse_nnodes(nnodes)[1] > 1:
            raise ValueError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the same on every machine (HOST: "
                             f"one of them, which hosts the rendezvous), and the same --rdzv-id")
        return None
    host, colon, port = endpoint.rpartition(":") if not endpoint.endswith("]") else (endpoint, "", "")
    host = host.strip("[]") if colon else endpoint.strip("[]")
    if not host or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"--rdzv-endpoint {endpoint!r}: give HOST:PORT, e.g. node0:29500")
    check_host(host, f"--rdzv-endpoint {endpoint}",
               "give the name or address of the machine hosting the rendezvous, as the other machines reach it")
    return host, int(port) if colon else RDZV_PORT


def _reachable(host: str, port: int, timeout_s: float) -> bool:
    """Whether the rendezvous at host:port answers within ``timeout_s`` (always, when this machine
    hosts it). Waited here, in Python, so that Ctrl-C works and a host that never answers is one
    line, not the store's retries with their C++ frames."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
    deadline = time.monotonic() + timeout_s
    while not _matches_machine_hostname(host):
        if listening(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def keep_rendezvous_on_restart() -> None:
    """torch 2.3's agent shut its rendezvous down when it stopped the workers to restart them,
    so the restart could never meet again: ``RendezvousClosedError`` instead of a restart
    (pytorch#123678, mended in 2.4 by #124819). There its restart leaves the rendezvous open,
    as later versions do; nothing changes on other versions."""
    if torch_release() != (2, 3):
        return
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    if getattr(LocalElasticAgent, "_dptrain_keeps_rendezvous", False):
        return
    restart = LocalElasticAgent._restart_workers

    def restart_keeping_rendezvous(self: Any, worker_group: Any) -> None:
        handler, self._rdzv_handler = self._rdzv_handler, None      # what its _shutdown would close
        try:
            restart(self, worker_group)
        finally:
            self._rdzv_handler = handler
    LocalElasticAgent._restart_workers = restart_keeping_rendezvous
    LocalElasticAgent._dptrain_keeps_rendezvous = True


def torch_release() -> Tuple[int, int]:
    """(major, minor) of the torch installed (``2.3.1+cu121`` -> ``(2, 3)``)."""
    import torch
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _launch_config(processes: int, nnodes: str, rdzv_endpoint: Optional[str], rdzv_id: Optional[str],
                   max_restarts: int, timeout_s: float, log_dir: str):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig
    low, high = parse_nnodes(nnodes)
    single = high == 1 and rdzv_endpoint is None
    wanted: Dict[str, Any] = dict(
        min_nodes=low, max_nodes=high, nproc_per_node=processes,
        run_id=rdzv_id or (uuid.uuid4().hex if single else "dptrain"),
        role="dptrain",
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",       # one machine: a free port, as torchrun --standalone
        # join_timeout: the wait for the other machines; read_timeout: for the store (default 60 s).
        rdzv_configs={"timeout": int(timeout_s), "join_timeout": int(timeout_s), "read_timeout": int(timeout_s)},
        max_restarts=max_restarts,
        monitor_interval=0.1,                               # a failure is seen within 0.1 s (old defaults: 5)
        start_method="spawn",
        log_line_prefix_template=None,
        metrics_cfg={},
        local_addr=None,
        # Local rank 0 keeps the terminal; the others write to files, read when one fails.
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects={r: Std.ALL for r in range(1, processes)}, tee={}),
        shutdown_timeout=INTERRUPT_GRACE_S,                 # time to save after Ctrl-C (torch >= 2.9)
        signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        event_log_handler="null",
    )
    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    return LaunchConfig(**{k: v for k, v in wanted.items() if k in fields}), single


def launch(command: Sequence[str], processes: int, nnodes: str = "1", rdzv_endpoint: Optional[str] = None,
           rdzv_id: Optional[str] = None, max_restarts: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Run ``python <command>`` (``["-m", "dptrain", "train", ...]``, ``["train.py", ...]``) as
    ``processes`` workers on this machine (times ``nnodes`` machines); return the exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch
    if processes < 1:
        raise ValueError(f"--processes must be at least 1, got {processes}")
    if max_restarts < 0:
        raise ValueError(f"--max-restarts must be at least 0, got {max_restarts}")
    endpoint = check_endpoint(rdzv_endpoint, nnodes)
    if endpoint is not None and not _reachable(*endpoint, timeout_s):
        print(_unreachable(rdzv_endpoint, timeout_s, "nothing answers"), file=sys.stderr)
        return 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, host_cores() // processes)))
    os.environ["DPTRAIN_LAUNCHED"] = "1"
    mark_job_start()            # max_time counts from here, restarted workers too
    os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(INTERRUPT_GRACE_S)
    quiet_agent()
    if max_restarts:
        keep_rendezvous_on_restart()
    with tempfile.TemporaryDirectory(prefix="dptrain-workers-") as log_dir:
        config, single = _launch_config(processes, nnodes, rdzv_endpoint, rdzv_id, max_restarts, timeout_s,
                                        log_dir)
        if single and sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        try:
            elastic_launch(config, entrypoint=sys.executable)(*command)
            return 0
        except ChildFailedError as e:
            codes = {f.exitcode for f in e.failures.values()}
            if codes == {INTERRUPTED}:                      # a signal to a worker: it saved and stopped
                return INTERRUPTED
            print(_report(e.failures, log_dir, processes * parse_nnodes(nnodes)[1]), file=sys.stderr)
            return 1
        except RendezvousError as e:
            print(_rendezvous_failed(e, rdzv_endpoint or "this machine", nnodes, timeout_s,
                                     started=bool(os.listdir(log_dir))), file=sys.stderr)
            return 1
        except Exception as e:
            sigval = _signal_of(e, SignalException)
            if sigval is None:
                raise
            print(f"dptrain: {signal.Signals(sigval).name}: all workers stopped", file=sys.stderr)
            return INTERRUPTED


def _signal_of(e: BaseException, kind: type) -> Optional[int]:
    """The signal that ended the agent: a ``SignalException`` (``kind``) in ``e``'s chain. torch's
    agent may raise another error as one unwinds it (its metrics wrapper's ``finally`` reads a
    ``start`` the signal came before: UnboundLocalError); it stopped the workers all the same."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e.sigval
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _rendezvous_failed(e: BaseException, where: str, nnodes: str, timeout_s: float, started: bool) -> str:
    """The one line for a rendezvous that failed: the other machines never came, the host of the
    rendezvous could not be reached, or (once the workers ran) the machine hosting it ended."""
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    low = parse_nnodes(nnodes)[0]
    if isinstance(e, RendezvousTimeoutError):
        return (f"dptrain: error: fewer than the {low} machines of --nnodes {nnodes} joined the rendezvous at "
                f"{where} within {timeout_s:g} s (--timeout): start the same command on the other machines, "
                f"with the same --rdzv-endpoint and --rdzv-id")
    if not started:
        return _unreachable(where, timeout_s, type(e).__name__)
    # Several machines: the agent hosting the rendezvous ended (say, after a worker of
    # its failed), and this agent lost it while watching its own workers.
    return (f"dptrain: error: lost the job's rendezvous at {where} ({type(e).__name__}): the machine "
            f"hosting it ended or cannot be reached; its output says why. Stopped the workers here")


def _unreachable(where: str, timeout_s: float, why: str) -> str:
    return (f"dptrain: error: no rendezvous at {where} within {timeout_s:g} s (--timeout; {why}): start the "
            f"job on the machine {where.rsplit(':', 1)[0]} first (it hosts the rendezvous), or check "
            f"--rdzv-endpoint and that its port is open")


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _tail(log_dir: str, local_rank: int) -> Sequence[str]:
    """The last lines a local rank wrote, in its most recent attempt's log file."""
    files = sorted(glob.glob(os.path.join(log_dir, "**", str(local_rank), "stderr.log"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        return []
    with open(files[-1], errors="replace") as f:
        return [line.rstrip("\n") for line in f.readlines()[-TAIL_LINES:]]


def _cause(item) -> tuple:
    """Root cause first: a worker that named the one that stopped answering (it may have killed
    it), a worker killed from outside (not by the agent's SIGTERM/SIGINT), the earliest that
    said why, one that exited with an error of its own (the user's code raised, or called
    sys.exit), and last the workers the agent stopped because another failed."""
    rank, failure = item
    stopped = -failure.exitcode in (signal.SIGTERM, signal.SIGINT)
    said = isinstance(failure.message, str) and failure.message.startswith("dptrain: ")
    blames = isinstance(failure.error_file_data, dict) and "blames" in failure.error_file_data
    order = 0 if blames else 1 if failure.exitcode < 0 and not stopped else 2 if said else \
        3 if failure.exitcode > 0 else 4
    return order, failure.timestamp, rank


def _blame(log_dir: str) -> Optional[Dict[str, Any]]:
    """What a worker of this machine left naming the rank that stopped answering (its error
    file's record, ``worker.record_error``), or None: the agent may have seen the rank it killed
    end before the worker that named it, and reported only the killed one."""
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "error.json"), recursive=True),
                       key=os.path.getmtime, reverse=True):
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "blames" in record and isinstance(record.get("message"), str):
            return record
    return None


def _report(failures: Dict[int, Any], log_dir: str, world: int) -> str:
    """One line for a failed job: the root cause (see ``_cause``), in its own words when it
    wrote some."""
    rank, failure = min(failures.items(), key=_cause)
    blame = _blame(log_dir) if _cause((rank, failure))[0] else None
    if blame is not None and blame["blames"] == rank:       # (the rank it named, which it killed)
        if blame.get("rank", 0) == 0:                        # its line is on the terminal already
            return f"dptrain: stopped the other workers (rank 0 of {world} named rank {rank})"
        return f"{blame['message']} (rank {blame.get('rank')} of {world}); stopped the other workers"
    how = _describe(failure.exitcode)
    said = failure.message if isinstance(failure.message, str) and failure.message.startswith("dptrain: ") else ""
    if not said:
        tail = _tail(log_dir, failure.local_rank)
        said = next((ln for ln in reversed(tail) if ln.startswith("dptrain: error: ")), "")
    others = "; stopped the other workers"
    if said and rank == 0 and failure.local_rank == 0:      # on the terminal already
        return f"dptrain: stopped the other workers (rank {rank} of {world}, {how})"
    if said:
        return f"{said} (rank {rank} of {world}, {how}){others}"
    tail = _tail(log_dir, failure.local_rank) if failure.local_rank else []
    detail = "\n".join(f"  [rank {rank}] {line}" for line in tail)
    return (f"dptrain: error: rank {rank} of {world} failed ({how}){others}"
            + (f". Its last output:\n{detail}" if detail else ""))
