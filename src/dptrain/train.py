"""The training loop behind ``dptrain train``: epochs of data-parallel steps, then test accuracy."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .config import TrainConfig
from .data import ArrayLoader, load_dataset
from .data.loader import prefetch
from .devices import cpu, format_device, num_gpus, parse_devices
from .distributed import DistEnv, get_collective, init_distributed, shutdown_distributed
from .evaluate import count_correct
from .parallel import get_runner
from .recipes import RECIPES

Log = Callable[[str], None]


def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for queued GPU work, so timings cover it (a no-op on CPU devices)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def hyperparameters(config: TrainConfig, n_devices: int) -> Tuple[int, int, float]:
    """Return ``(epochs, batch_size, lr)``: the config's values, else the recipe's.

    A per-device recipe (resnet18) multiplies its default batch and lr by the device count
    (the linear scaling rule) unless ``scale=False``; values given explicitly are global.
    """
    recipe = RECIPES[config.recipe]
    scale = n_devices if recipe.per_device and config.scale else 1
    return (config.epochs or recipe.epochs, config.batch_size or recipe.batch_size * scale,
            config.lr or recipe.lr * scale)


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
        return _Run(config, env, devices, backend, log if env.rank == 0 else None).run()
    finally:
        if backend is not None:
            shutdown_distributed()


class _Run:
    """One training run: built from the config, then ``run()`` epoch by epoch."""

    def __init__(self, config: TrainConfig, env: DistEnv, devices: List[torch.device],
                 backend: Optional[str], log: Optional[Log]):
        self.config, self.env, self.devices, self.backend = config, env, devices, backend
        self.log = log or (lambda _: None)
        self.recipe = RECIPES[config.recipe]
        self.collective = get_collective()
        self.epochs, self.batch_size, self.lr = hyperparameters(config, len(devices))
        total_devices = len(devices) * env.world_size
        if self.batch_size < total_devices:
            raise ValueError(f"batch size {self.batch_size} is smaller than the {total_devices} devices: "
                             f"use --batch-size {total_devices} or more, or fewer --devices")
        torch.manual_seed(config.seed)
        self.engine = self.recipe.build(config, devices, self.lr)   # before the data: fail fast
        data = load_dataset(config.dataset or self.recipe.dataset, config.data_dir)
        self.dataset = data.name
        shard = dict(rank=env.rank, world_size=env.world_size)
        self.train_loader = ArrayLoader(data.train_X, data.train_y, self.batch_size, shuffle=True,
                                        seed=config.seed, max_batches=config.max_batches, **shard)
        self.test_loader = ArrayLoader(data.test_X, data.test_y, self.batch_size,
                                       max_batches=config.eval_batches, **shard)
        self.runner = get_runner(devices)

    def run(self) -> Dict[str, Any]:
        history: List[Dict[str, Any]] = []
        for epoch in range(1, self.epochs + 1):
            sec, loss_sum = self._train_epoch(epoch)
            correct, count = count_correct(self.engine.predictors(), self.test_loader, self.devices)
            totals = self.collective.all_reduce(torch.tensor([loss_sum, correct, count], dtype=torch.float64))
            row = {"epoch": epoch, "sec": sec,
                   "train_loss": totals[0].item() / self.train_loader.global_num_samples,
                   "test_acc": totals[1].item() / totals[2].item()}
            history.append(row)
            self.log(f"epoch {epoch}, {sec:.1f} sec, train loss {row['train_loss']:.3f}, "
                     f"test acc {row['test_acc']:.3f}")
        return self._result(history)

    def _train_epoch(self, epoch: int) -> Tuple[float, float]:
        self.train_loader.set_epoch(epoch - 1)
        synchronize(self.devices)
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.devices[0])
        batches = prefetch(self.train_loader) if len(self.devices) > 1 else self.train_loader
        with self.runner.coordinating():
            for X, y in batches:
                loss_sum += self.engine.train_batch(X, y, self.lr)
        synchronize(self.devices)
        return time.perf_counter() - start, loss_sum.item()

    def _result(self, history: List[Dict[str, Any]]) -> Dict[str, Any]:
        config, recipe = self.config, self.recipe
        names = [format_device(d) for d in self.devices]
        seconds = sum(h["sec"] for h in history)
        result = {
            "recipe": recipe.name, "devices": names, "world_size": self.env.world_size,
            "epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": config.seed,
            "dataset": self.dataset,
            **({"optimizer": config.optimizer or recipe.optimizer,
                "kvstore": "dist" if self.env.distributed else config.kvstore,
                "sync_bn": config.sync_bn, "amp": config.amp}
               if recipe.uses_trainer else {"allreduce": config.allreduce}),
            **({"backend": self.backend} if self.backend else {}),
            "test_acc": history[-1]["test_acc"],
            "sec_per_epoch": seconds / self.epochs,
            "images_per_sec": self.train_loader.global_num_samples * self.epochs / seconds if seconds else 0.0,
            "history": history,
        }
        where = f"[{', '.join(names)}]"
        if self.env.distributed:
            where = f"{self.env.world_size} processes x {where}"
        self.log(f"test acc: {result['test_acc']:.2f}, {result['sec_per_epoch']:.1f} sec/epoch on {where}")
        return result
