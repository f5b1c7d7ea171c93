"""``devices="auto"`` on a CPU: virtual devices only where they pay.

Two virtual CPU devices doubled LeNet's speed (each computes half the batch on its own
core), but for a small model the work of splitting, two threads and the gradient sum is
more than the compute saved: the tiny MLP of issue 22 took 3x longer a step. So without a
GPU, ``auto`` measures: a few real steps of the model on the first batch, on one device and
on the virtual devices, in turns, on copies of the model (the run itself is untouched, the
random state too); the virtual devices are chosen only when their median step is clearly
shorter (``MARGIN``), and one line says what was chosen and why. A step of more than
``COMPUTE_BOUND_S`` on one device is compute-bound: the virtual devices then get a short probe
(``SHORT``: one warm-up and two timed steps; the fastest of each side counts) rather than the
full one, which would cost many seconds. (They were once taken there unmeasured, on the guess
that a long step's compute pays for a split: ResNet-18 at batch 64 then ran 0.82x one device's
speed; intra-op threads split large operations well.) Several processes,
GPUs, explicit ``devices=``, per-device recipes (whose batch depends on the device count),
resumed runs (which keep the devices they were started on) and runs with loading workers
(see ``wanted``) are not probed.
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Any, Callable, List, Optional, Tuple

import torch

from ..core.devices import format_device
from ..data.dataset_loader import make_loader
from ..engine.model_engine import ModelEngine
from ..engine.task import Task
from .config import TrainConfig

WARM_UP, TIMED, BLOCKS = 2, 6, 2        # steps on each side, in blocks
MARGIN = 0.95                # the virtual devices' step must be this fraction of one device's, or less
COMPUTE_BOUND_S = 0.25
SHORT = 1, 2                 # warm-up and timed steps of the virtual devices for a compute-bound model


def kvstore(task: Task, config: TrainConfig) -> Optional[str]:
    """The kvstore the run will use (as ``build_engine`` takes it)."""
    return task.kvstore if config.kvstore is None else config.kvstore_kind


def wanted(config: TrainConfig, task: Task, devices: List[torch.device], distributed: bool, batch_size: int) -> bool:
    """Whether to measure (see the module docstring). Not where the settings ask for several
    devices or cannot have them, whose errors stay as they were: ``kvstore=None`` (sums
    nothing), ``--sync-bn`` (BatchNorm across the devices), a batch smaller than the devices.
    Nor with loading workers: the probe would read its batch without them, unbounded by
    ``--worker-timeout``, and the workers' share of the cores is not in its steps (the CNN of
    issue 22 with 2 workers ran 1.13x faster on the virtual devices): they stay."""
    return (config.devices in (None, "", "auto") and not distributed and not config.resume and not task.per_device
            and len(devices) > 1 and all(d.type == "cpu" for d in devices) and config.balance in (None, "even")
            and kvstore(task, config) is not None and not config.sync_batchnorm and batch_size >= len(devices)
            and not config.num_workers)


def choose(task: Task, config: TrainConfig, devices: List[torch.device], batch_size: int,
           log: Callable[[str], None]) -> Tuple[Task, List[torch.device]]:
    """The devices to train on (see the module docstring), and the task with its training
    data loaded (so a data factory runs once)."""
    data = task.load("train_data")
    task = dataclasses.replace(task, train_data=data)
    loader = make_loader(data, batch_size, collate_fn=task.collate_fn, shuffle=False, seed=0)
    batch = next(iter(loader.batches()))
    n = len(devices)
    rng = torch.get_rng_state()
    engines = {}
    try:
        engines = {k: _engine(task, config, devices[:k], loader.example()) for k in (1, n)}
        times = {1: [], n: []}
        for block in range(2 * BLOCKS):           # in blocks, as the loop runs them (and alternating)
            k = (1, n)[block % 2] if block // 2 % 2 == 0 else (n, 1)[block % 2]
            with engines[k].runner.coordinating():
                for _ in range((WARM_UP if block < 2 else 0) + TIMED // BLOCKS):
                    start = time.perf_counter()
                    engines[k].train_batch(batch)
                    times[k].append(time.perf_counter() - start)
            if k == 1 and block == 0 and min(times[1]) > COMPUTE_BOUND_S:
                return task, _short(engines[n], batch, times[1][WARM_UP:], devices, log)
    finally:
        for e in engines.values():
            e.trainer.close()
        torch.set_rng_state(rng)
    one, many = (statistics.median(times[k][WARM_UP:]) for k in (1, n))
    pick = devices if many <= MARGIN * one else devices[:1]
    log(f"dptrain: devices auto: {_names(pick)}: a step took {one * 1e3:.2f} ms on one device, {many * 1e3:.2f} ms "
        f"on {n} virtual devices (median of {TIMED}); pass devices= to choose")
    return task, pick


def _short(engine: ModelEngine, batch: Any, one: List[float], devices: List[torch.device],
           log: Callable[[str], None]) -> List[torch.device]:
    """A compute-bound model: a few steps on the virtual devices, against one device's so far."""
    many = []
    with engine.runner.coordinating():
        for _ in range(sum(SHORT)):
            start = time.perf_counter()
            engine.train_batch(batch)
            many.append(time.perf_counter() - start)
    best_one, best_many = min(one), min(many[SHORT[0]:])
    pick = devices if best_many <= MARGIN * best_one else devices[:1]
    log(f"dptrain: devices auto: {_names(pick)}: a step took {best_one:.2f} s on one device, {best_many:.2f} s on "
        f"{len(devices)} virtual devices (fastest of {len(one)} and {SHORT[1]}: compute-bound, a short probe); "
        f"pass devices= to choose")
    return pick


def _engine(task: Task, config: TrainConfig, devices: List[torch.device], example: Any) -> ModelEngine:
    optimizer: Optional[Any] = task.optimizer
    if isinstance(optimizer, torch.optim.Optimizer):        # built on the real model: its kind, on the copy
        optimizer = type(optimizer)
    probe = dataclasses.replace(task, model=copy.deepcopy(task.model), optimizer=optimizer, callbacks=[])
    engine = ModelEngine(probe, devices, kvstore=kvstore(task, config), amp=config.amp_dtype,
                         clip_grad_norm=config.clip_grad_norm)
    engine.prepare(example, task.lr)
    return engine


def _names(devices: List[torch.device]) -> str:
    return ", ".join(format_device(d) for d in devices)
