"""Work done by one process of each machine while the others wait: a data set's download
(a ``LightningDataModule``'s ``prepare_data``), which every process then reads from the disk.

    once_per_machine(dm.prepare_data)           # local rank 0 of each machine; the rest wait
    once_per_machine(dm.prepare_data, per_machine=False)     # rank 0 alone (a shared disk)

The wait is a gathering over a group of its own (gloo, on the CPU) whose timeout is
``WAIT_S``, not the training's collectives' (a download outlasts a minute); what it gathers
is each process's error, so one that fails ends every process with its message, none
waiting for it. A process that dies ends the gathering too: gloo sees its connection close.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable, Optional

import torch.distributed as dist

from .env import DistEnv

#: How long the processes wait for the one doing the work (a large download: an hour).
WAIT_S = 3600.0


class FailedElsewhere(RuntimeError):
    """The work failed in another process; its error is the message."""


def once_per_machine(fn: Callable[[], object], per_machine: bool = True, what: Optional[str] = None) -> None:
    """Call ``fn`` in one process of each machine (of the whole job when ``per_machine`` is
    False) while every other process waits for it; with no process group, call it here.
    ``what`` names ``fn`` in the error the other processes raise when it fails."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        fn()
        return
    env = DistEnv.current()
    mine = env.local_rank == 0 if per_machine else env.rank == 0
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=WAIT_S))
    error: Optional[BaseException] = None
    try:
        if mine:
            try:
                fn()
            except Exception as e:          # (told to every process, then raised here as it is)
                error = e
        said = [None] * env.world_size
        dist.all_gather_object(said, None if error is None else f"{type(error).__name__}: {error}", group=group)
    finally:
        dist.destroy_process_group(group)
    if error is not None:
        raise error
    failed = [(rank, text) for rank, text in enumerate(said) if text is not None]
    if failed:
        rank, text = failed[0]
        raise FailedElsewhere(f"{what or getattr(fn, '__qualname__', 'the work')} failed in the process of rank "
                              f"{rank}, which this one waited for: {text}")
