"""Run a Task as a config says, in one process or as one of several: what ``fit`` and
``dptrain train`` share.

Under ``torchrun``, ``dptrain launch`` or ``--processes`` (``WORLD_SIZE`` > 1 in the
environment) the process joins the process group itself, trains its part of every global
batch, and only rank 0 logs and writes files.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .config import TrainConfig
from ..core.devices import cpu, num_gpus, parse_devices
from ..core.host_memory import keep_freed_host_memory
from ..core.stage import stage
from ..data.dispatch import one_way_to_read
from ..distributed import Collective, DistEnv, get_collective, init_distributed, shutdown_distributed
from ..outputs.checkpoint import FILENAME
from ..distributed.env import attempt, choose_backend
from ..distributed.worker import die_with_launcher, end_interrupted_quietly
from ..distributed.heartbeat import Heartbeat
from .loop import Run
from .preflight import check_outputs
from ..engine.task import Task
from ..engine.user_scheduler import LentScheduler
from ..parallel.given_model import check_trainable

Log = Callable[[str], None]


def process_devices(spec: Any, env: DistEnv) -> List[torch.device]:
    """This process's devices. One process: ``parse_devices(spec)``. Several: ``auto`` is
    ``cuda:LOCAL_RANK`` on a GPU machine, else one virtual CPU device; a list or a count is
    per process."""
    if not env.distributed or spec not in (None, "", "auto"):
        return parse_devices(spec)
    if num_gpus() > env.local_rank:
        return [torch.device("cuda", env.local_rank)]
    if num_gpus():
        raise ValueError(f"local rank {env.local_rank} has no GPU: this machine has {num_gpus()}; "
                         f"start at most {num_gpus()} processes per machine")
    return [cpu(0)]


def inference_devices(spec: Any, env: DistEnv) -> List[torch.device]:
    """The devices ``predict`` and ``evaluate`` run on: as ``process_devices``, except that
    ``auto`` without a GPU is one CPU device. A forward pass already spreads over the cores
    (intra-op threads), so two virtual devices only add the split and a thread hand-off: on
    the everyday programs (2 cores, session 18) one device predicted 5x faster on the tiny
    MLP, 1.27x on the text classifier, 1.13x on LeNet, and 0.95x on ResNet-18."""
    if not env.distributed and spec in (None, "", "auto") and not num_gpus():
        return [cpu(0)]
    return process_devices(spec, env)


#: Where predict and evaluate meet the other processes: the phrase a failure there carries.
ALL_CALL = ("{} with the other processes (every process of the job calls {}, each doing its part; to call it in "
            "one process alone, if rank == 0:, pass local=True)")


def inference_job(spec: Any, timeout_s: float, dispatch_batches: bool, sharded_stream: bool,
                  local: bool) -> Tuple[DistEnv, List[torch.device], Collective]:
    """``predict``'s and ``evaluate``'s job: the processes it spans (joined now if need be),
    this process's devices and the collective over them. ``local``: this process alone, every
    sample read here and nothing sent (called on rank 0 only, ``if rank == 0:``); called so
    without it, the others never come and the call fails or waits for its timeout."""
    one_way_to_read(dispatch_batches, sharded_stream)
    env = DistEnv.current()
    devices = inference_devices(spec, env)
    if local:
        if dispatch_batches or sharded_stream:
            raise ValueError("local=True reads every sample in this process alone; dispatch_batches and "
                             "sharded_stream need the other processes: drop them")
        return DistEnv(), devices, Collective()
    if join_job(env, "auto", devices, timeout_s):
        atexit.register(shutdown_distributed)       # kept for the script's next call, as fit does
    return env, devices, get_collective()


def after_restart(config: TrainConfig, log: Optional[Log]) -> TrainConfig:
    """After the elastic agent restarted the job: resume from the last checkpoint if there is
    one (the command is the same as the first time, without --resume), else start over."""
    n = attempt()
    if n == 0:
        return config
    saved = bool(config.checkpoint_dir) and (Path(config.checkpoint_dir) / FILENAME).exists()
    if log:
        limit = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "?")
        log(f"dptrain: restart {n} of {limit} after a failure: "
            + ("resuming from the last checkpoint" if saved else "starting over (no checkpoint yet)"))
    return dataclasses.replace(config, resume=saved, overwrite=not saved)


def join_job(env: DistEnv, backend: str, devices: List[torch.device], timeout_s: float) -> bool:
    """Join the process group the environment describes, if this process has not; return
    whether it joined now."""
    joining = env.distributed and not torch.distributed.is_initialized()
    init_distributed(env, backend, use_cuda=any(d.type == "cuda" for d in devices), timeout_s=timeout_s)
    return joining


def _join(env: DistEnv, config: TrainConfig) -> Tuple[List[torch.device], bool]:
    """This process's devices, and the process group joined as ``config`` says (whether now)."""
    devices = process_devices(config.devices, env)
    keep_freed_host_memory()        # no page faults for a step's temporaries (core/host_memory.py)
    # Checked even for one process, where it is not used: --backend nccl without GPUs is an error.
    choose_backend(config.backend, use_cuda=any(d.type == "cuda" for d in devices))
    with stage(f"joining the process group as rank {env.rank} of {env.world_size}"):
        joined = join_job(env, config.backend, devices, config.timeout)
    return devices, joined


def join_before_run(config: TrainConfig) -> None:
    """Join the process group before ``fit`` sets up its run (a data module's ``prepare_data``
    waits on it); the group stays for the script's next ``fit``, ended at exit."""
    env = DistEnv.current()
    if not env.distributed or torch.distributed.is_initialized():
        return
    die_with_launcher()
    if _join(env, config)[1]:
        atexit.register(shutdown_distributed)


def run_task(task: Task, config: TrainConfig, log: Optional[Log] = print,
             plot: Optional[str] = None, keep_group: bool = False) -> Dict[str, Any]:
    """Train ``task`` as ``config`` says; return the result (the ``--json`` object).

    Every file the run will write is checked first (``preflight.py``), ``plot`` too (the
    caller draws it, with ``draw``, once it has what it must not lose). ``keep_group``: a
    process group joined here stays (for a script's next ``fit``) instead of ending with the run."""
    check_trainable(task.model)
    env = DistEnv.current()
    die_with_launcher()
    config = after_restart(config, log if env.rank == 0 else None)
    if env.rank == 0:
        check_outputs(config, plot)
    devices, joined = _join(env, config)
    backend = torch.distributed.get_backend() if env.distributed else None
    beat = Heartbeat(env.rank, env.world_size, config.timeout).start() \
        if env.distributed and "MASTER_PORT" in os.environ else None
    if keep_group and env.distributed:     # a launched script: Ctrl-C ends it in one line, code 130
        end_interrupted_quietly()
    try:
        with stage("setting up the run"):
            run = Run(task, config, env, devices, backend, log if env.rank == 0 else None)
        try:
            result = run.run()
        finally:
            run.close()
            del run
    finally:
        # Nothing is left for Python's collector: the run sits in no reference cycle (a test
        # checks), so it is freed here, while the process group exists. (Left to the collector,
        # gloo objects freed at interpreter exit aborted 2-4 runs in 10, "terminate called
        # without an active exception"; a full collection here cost 130-160 ms a fit.)
        if isinstance(task.scheduler, LentScheduler):       # bound to the user's optimizer again
            task.scheduler.give_back()
        if beat is not None:
            beat.stop()
        if joined:
            if keep_group:      # fit in a script: the group stays for its next fit, ended at exit
                atexit.register(shutdown_distributed)
            else:               # dptrain train: one run per process, ended as it ends
                shutdown_distributed()
    return result
