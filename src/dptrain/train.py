"""``train(config)``: what ``dptrain train`` runs, in one process or as one of several."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from .config import TrainConfig
from .devices import cpu, num_gpus, parse_devices
from .distributed import DistEnv, init_distributed, shutdown_distributed
from .loop import Run

Log = Callable[[str], None]


def process_devices(spec: str, env: DistEnv) -> List[torch.device]:
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


def train(config: TrainConfig, log: Optional[Log] = print) -> Dict[str, Any]:
    """Run a recipe as ``config`` says; return the result (the ``--json`` object).

    Under ``torchrun`` or ``--processes`` (RANK/WORLD_SIZE set) this process trains its part
    of every batch and only rank 0 logs.

    >>> result = train(TrainConfig(recipe="lenet-scratch", devices="2", epochs=1))
    epoch 1, 8.1 sec, train loss 0.912, test acc 0.712
    >>> result["test_acc"], result["devices"]
    (0.712, ['cpu:0', 'cpu:1'])
    """
    env = DistEnv.from_environ()
    devices = process_devices(config.devices, env)
    backend = init_distributed(env, config.backend, use_cuda=any(d.type == "cuda" for d in devices))
    try:
        return Run(config, env, devices, backend, log if env.rank == 0 else None).run()
    finally:
        if backend is not None:
            shutdown_distributed()
