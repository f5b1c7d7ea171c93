"""The training loop behind ``dptrain train``: epochs of data-parallel steps, then test accuracy."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .config import TrainConfig
from .data import ArrayLoader, load_dataset
from .data.loader import prefetch
from .devices import format_device, parse_devices
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


def train(config: TrainConfig, log: Optional[Log] = print) -> Dict[str, Any]:
    """Run a recipe as ``config`` says; return the result (the ``--json`` object).

    >>> result = train(TrainConfig(recipe="lenet-scratch", devices="2", epochs=1))
    epoch 1, 8.1 sec, train loss 0.912, test acc 0.712
    >>> result["test_acc"], result["devices"]
    (0.712, ['cpu:0', 'cpu:1'])
    """
    log = log or (lambda _: None)
    recipe = RECIPES[config.recipe]
    devices = parse_devices(config.devices)
    epochs, batch_size, lr = hyperparameters(config, len(devices))
    if batch_size < len(devices):
        raise ValueError(f"batch size {batch_size} is smaller than the {len(devices)} devices: "
                         f"use --batch-size {len(devices)} or more, or fewer --devices")
    torch.manual_seed(config.seed)
    engine = recipe.build(config, devices, lr)      # before the data: bad settings fail fast
    data = load_dataset(config.dataset or recipe.dataset, config.data_dir)
    train_loader = ArrayLoader(data.train_X, data.train_y, batch_size, shuffle=True,
                               seed=config.seed, max_batches=config.max_batches)
    test_loader = ArrayLoader(data.test_X, data.test_y, batch_size, max_batches=config.eval_batches)
    runner = get_runner(devices)

    history: List[Dict[str, Any]] = []
    train_seconds, images = 0.0, 0
    for epoch in range(1, epochs + 1):
        train_loader.set_epoch(epoch - 1)
        synchronize(devices)
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=devices[0])
        batches = prefetch(train_loader) if len(devices) > 1 else train_loader
        with runner.coordinating():
            for X, y in batches:
                loss_sum += engine.train_batch(X, y, lr)
        synchronize(devices)
        sec = time.perf_counter() - start
        train_seconds += sec
        images += train_loader.num_samples
        correct, count = count_correct(engine.predictors(), test_loader, devices)
        row = {"epoch": epoch, "sec": sec,
               "train_loss": loss_sum.item() / train_loader.num_samples,
               "test_acc": correct / count}
        history.append(row)
        log(f"epoch {epoch}, {sec:.1f} sec, train loss {row['train_loss']:.3f}, "
            f"test acc {row['test_acc']:.3f}")
    names = [format_device(d) for d in devices]
    result = {
        "recipe": recipe.name, "devices": names, "epochs": epochs, "batch_size": batch_size,
        "lr": lr, "seed": config.seed, "dataset": data.name,
        **({"optimizer": config.optimizer or recipe.optimizer,
            "kvstore": config.kvstore, "sync_bn": config.sync_bn, "amp": config.amp}
           if recipe.uses_trainer else {"allreduce": config.allreduce}),
        "test_acc": history[-1]["test_acc"],
        "sec_per_epoch": train_seconds / epochs,
        "images_per_sec": images / train_seconds if train_seconds else 0.0,
        "history": history,
    }
    log(f"test acc: {result['test_acc']:.2f}, {result['sec_per_epoch']:.1f} sec/epoch "
        f"on [{', '.join(names)}]")
    return result
