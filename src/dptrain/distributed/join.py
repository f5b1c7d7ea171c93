"""Joining (and leaving) the process group: bounded in time, answering Ctrl-C, naming who is missing.

``init_process_group`` waits in C++: a peer that never comes, or a ``MASTER_PORT`` where
some other program listens, held a process for minutes, deaf to Ctrl-C, and then printed
a stack dump. Here the join (a TCPStore on ``MASTER_ADDR:MASTER_PORT``, every rank marking
itself present, then the process group on that store) runs on a helper thread, while the
calling thread waits in Python: Ctrl-C ends the wait, and after ``timeout_s`` one line says
which ranks did not come, or that the port is not a rendezvous server.

Under torchrun's elastic agent (``TORCHELASTIC_USE_AGENT_STORE``) the agent hosts the store
and every rank is a client of it; otherwise rank 0 hosts it, as ``env://`` does.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

from ..core.errors import RendezvousError
from .env import COLLECTIVE_MARGIN_S, DEFAULT_TIMEOUT_S, DistEnv, check_host, choose_backend, store_key


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


class _Join(threading.Thread):
    def __init__(self, backend: str, rank: int, world: int, host: str, port: int, timeout_s: float,
                 collective_timeout_s: float):
        super().__init__(name="dptrain-rendezvous", daemon=True)
        self.backend, self.rank, self.world, self.host, self.port = backend, rank, world, host, port
        self.timeout_s, self.collective_timeout_s = timeout_s, collective_timeout_s
        self.store: Optional[dist.Store] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            store = dist.TCPStore(self.host, self.port, self.world, is_master=self.rank == 0 and not _agent_store(),
                                  timeout=timedelta(seconds=self.timeout_s), wait_for_workers=False,
                                  multi_tenant=True)
            store.set(store_key(f"joined/{self.rank}"), "1")
            everyone = [store_key(f"joined/{r}") for r in range(self.world)]
            while not store.check(everyone):
                self.store = store      # it answered as a store (torch 2.3's waits for ever on another server)
                time.sleep(0.05)
            self.store = store
            dist.init_process_group(self.backend, store=dist.PrefixStore(store_key("pg"), store), rank=self.rank,
                                    world_size=self.world, timeout=timedelta(seconds=self.collective_timeout_s))
        except BaseException as e:      # handed to the waiting thread
            self.error = e
        finally:
            self.done.set()

    def missing(self) -> Optional[List[int]]:
        """The ranks that have not marked themselves present (None: the store is out of reach,
        or never answered as one: asking it again would wait for ever, deaf to Ctrl-C)."""
        if self.store is None:
            return None
        try:
            return [r for r in range(self.world) if not self.store.check([store_key(f"joined/{r}")])]
        except RuntimeError:
            return None


def join(backend: str, rank: int, world: int, timeout_s: float, collective_timeout_s: float) -> None:
    """Join the process group of ``world`` ranks at ``MASTER_ADDR:MASTER_PORT`` within ``timeout_s``.

    Raises ``RendezvousError`` naming the ranks that did not come (or why the store could not
    be reached), ``ValueError`` for a port that is taken, and ``KeyboardInterrupt`` on Ctrl-C.
    """
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    where = f"{host}:{port}"
    joining = _Join(backend, rank, world, host, port, timeout_s, collective_timeout_s)
    joining.start()
    deadline = time.monotonic() + timeout_s
    while not joining.done.wait(0.1):          # Python waits: Ctrl-C lands here
        if time.monotonic() > deadline:
            raise RendezvousError(_why_late(joining, rank, world, where, timeout_s))
    if joining.error is not None:
        text = str(joining.error).lower()
        if "address already in use" in text or "eaddrinuse" in text:
            raise ValueError(f"MASTER_PORT {port} is already in use on {host}: pick another port (torchrun "
                             f"--master-port N), or stop the program holding it") from None
        if isinstance(joining.error, (RuntimeError, OSError)) and ("timeout" in text or "timed out" in text):
            raise RendezvousError(_why_late(joining, rank, world, where, timeout_s)) from None
        raise joining.error


def _why_late(joining: _Join, rank: int, world: int, where: str, timeout_s: float) -> str:
    missing = joining.missing()
    fix = f"(--timeout changes the {timeout_s:g} s wait)"
    if missing:
        names = ", ".join(map(str, missing))
        return (f"rank{'s' if len(missing) > 1 else ''} {names} of {world} did not join within {timeout_s:g} s "
                f"(rendezvous at {where}): start {'them' if len(missing) > 1 else 'it'}, or check WORLD_SIZE "
                f"{fix}")
    if missing is None:
        host, port = where.rsplit(":", 1)
        if rank != 0 or _agent_store():
            if listening(host, int(port)):
                return (f"{where} answers, but not as a rendezvous server: is MASTER_PORT another program's "
                        f"port? {fix}")
            return (f"no rendezvous server at {where} within {timeout_s:g} s: start rank 0 (it hosts it), or "
                    f"check MASTER_ADDR and MASTER_PORT {fix}")
    return f"the process group at {where} did not form within {timeout_s:g} s {fix}"


def init_distributed(env: DistEnv, backend: str = "auto", use_cuda: bool = False,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> Optional[str]:
    """Join the process group described by ``env``; return the backend (None for one process)."""
    if not env.distributed:
        return None
    backend = choose_backend(backend, use_cuda)
    if dist.is_initialized():
        return dist.get_backend()
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ValueError(f"WORLD_SIZE={env.world_size} but {name} is not set: launch with "
                             f"dptrain train --processes N, or torchrun")
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    if not os.environ["MASTER_PORT"].isdigit() or not 0 < int(os.environ["MASTER_PORT"]) < 65536:
        raise ValueError(f"MASTER_PORT={os.environ['MASTER_PORT']!r} is not a port number (1-65535)")
    check_host(os.environ["MASTER_ADDR"], f"MASTER_ADDR={os.environ['MASTER_ADDR']}",
               "give the name or address of the machine running rank 0 (torchrun --master-addr)")
    join(backend, env.rank, env.world_size, timeout_s, timeout_s + COLLECTIVE_MARGIN_S)
    return backend


def join_from_environment() -> Optional[str]:
    """Join the job the environment describes (torchrun's variables), if any and not yet."""
    env = DistEnv.from_environ()
    if not env.distributed or dist.is_initialized():
        return None
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > env.local_rank
    return init_distributed(env, "auto", use_cuda=use_cuda)


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
