"""Run a function in 2 processes joined by gloo on loopback, with a timeout on every join.

As PyTorch's MultiProcessTestCase does: fresh processes (forked from a warm fork server,
``tests/warm.py``, with the test's environment and folder: as spawned ones, without the 3 s
of importing torch each), rendezvous through a file in a temp dir (no port clashes),
OMP_NUM_THREADS=1, the children's tracebacks shown when they fail, the process group
destroyed at the end, and every child killed if the deadline passes.
"""
import os
import queue
import tempfile
import traceback
from datetime import timedelta

import pytest

from tests.warm import CONTEXT, become, here

TIMEOUT_S = 120


def _entry(fn, rank, world_size, init_file, results, args, place):
    become(place)
    os.environ.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=60))
        results.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_workers(fn, *args, world_size=2, timeout=TIMEOUT_S):
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes; return their results."""
    results = CONTEXT.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [CONTEXT.Process(target=_entry, args=(fn, r, world_size, init_file, results, args, here()),
                                 daemon=False)          # DataLoader workers need a non-daemon parent
                 for r in range(world_size)]
        for p in procs:
            p.start()
        out, errors = {}, []
        try:
            for _ in range(world_size):
                rank, status, value = results.get(timeout=timeout)
                (out.__setitem__(rank, value) if status == "ok" else errors.append(f"rank {rank}:\n{value}"))
        except queue.Empty:
            errors.append(f"timed out after {timeout} s waiting for the workers")
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join()
    if errors:
        pytest.fail("\n".join(errors))
    return [out[r] for r in range(world_size)]
