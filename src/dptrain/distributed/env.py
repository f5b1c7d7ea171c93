"""The process's place in a job: read from the environment torchrun (or ``--processes``) sets.

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``: the variables ``torchrun`` exports. Without them a process is rank 0 of 1
and nothing is initialised. ``DPTRAIN_JOB_START``: when the job began (``max_time`` counts
from it, so workers restarted within a job share its time limit).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")

#: How long a process waits for its peers to join, or for a silent peer, before it says which
#: rank did not answer and ends (``--timeout``). Collectives get this plus ``COLLECTIVE_MARGIN_S``,
#: so the heartbeat (which names the right rank) always speaks first.
DEFAULT_TIMEOUT_S = 60.0
COLLECTIVE_MARGIN_S = 60.0


#: Where a job's start is kept for its workers (seconds since the epoch).
JOB_START = "DPTRAIN_JOB_START"


def mark_job_start() -> None:
    """Write the job's start for the workers it starts (kept if the job script set it)."""
    os.environ.setdefault(JOB_START, f"{time.time():.3f}")


def job_elapsed() -> float:
    """Seconds since the job started (``DPTRAIN_JOB_START``); 0 without it."""
    text = os.environ.get(JOB_START)
    if not text:
        return 0.0
    try:
        started = float(text)
    except ValueError:
        raise ValueError(f"{JOB_START} must be the job's start in seconds since the epoch (as `date +%s` gives), "
                         f"got {text!r}: set it so, or unset it to count max_time from this run's start") from None
    return max(0.0, time.time() - started)


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environ(cls) -> "DistEnv":
        def read(name: str, default: int) -> int:
            text = os.environ.get(name)
            if text is None:
                return default
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"environment variable {name}={text!r} is not an integer") from None
        world = read("WORLD_SIZE", 1)
        rank = read("RANK", 0)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"RANK={rank} and WORLD_SIZE={world} do not fit: need 0 <= RANK < WORLD_SIZE")
        local_world = read("LOCAL_WORLD_SIZE", 1 if world == 1 else world)
        return cls(rank, world, read("LOCAL_RANK", rank % max(local_world, 1)), local_world)

    @classmethod
    def current(cls) -> "DistEnv":
        """The process group this process already joined, if any (however it was started),
        else the environment's description of the job."""
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if os.environ.get(
                "LOCAL_WORLD_SIZE", "").isdigit() else world
            local = os.environ.get("LOCAL_RANK", "")
            return cls(rank, world, int(local) if local.isdigit() else rank % max(local_world, 1), local_world)
        return cls.from_environ()


def check_host(host: str, what: str, fix: str) -> None:
    """Refuse at once a host name that does not resolve: the engine would retry it for a
    minute or two and then print its C++ frames."""
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        reason = e.strerror if isinstance(e, socket.gaierror) and e.strerror else str(e)
        raise ValueError(f"{what}: the host name {host!r} does not resolve ({reason}): {fix}") from None


def attempt() -> int:
    """Which start of the job this is: 0, then 1, 2... after the elastic agent restarted it."""
    text = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(text) if text.isdigit() else 0


def store_key(name: str) -> str:
    """A rendezvous-store key of this attempt: the agent's store outlives a restart, and with
    it the keys of the attempt before."""
    return f"dptrain/attempt{attempt()}/{name}"


def rank() -> int:
    """This process's rank in its job (0 outside one): ``if dptrain.rank() == 0: print(...)``."""
    return DistEnv.current().rank


def choose_backend(backend: str, use_cuda: bool) -> str:
    """``auto``: NCCL for GPU processes, gloo otherwise; NCCL without a GPU is an error."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "nccl" if use_cuda else "gloo"
    if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise ValueError("--backend nccl needs GPUs (CUDA) and a PyTorch built with NCCL; this machine "
                         "has none: use --backend gloo (or auto)")
    return backend


#: What gloo and NCCL say when the process at the other end of a connection went away.
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused",
              "NCCL communicator was aborted", "remote process exited")


def lost_peer(e: BaseException) -> Optional[str]:
    """The one line for a collective that failed because another process ended (killed, or
    failed with its own error), or None if ``e`` is something else."""
    text = str(e)
    hit = next((s for s in _PEER_GONE if s in text), None)
    if hit is None:
        return None
    env = DistEnv.from_environ()
    if not env.distributed:
        return None
    return (f"rank {env.rank} of {env.world_size} lost its connection to another process "
            f"({hit}): that process ended or was killed, and its own output says why")
