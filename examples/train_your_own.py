"""Your own model on your own data, with every feature of dptrain: one file, run three ways.

    python examples/train_your_own.py                              # all GPUs, else 2 virtual CPU devices
    dptrain launch --processes 2 examples/train_your_own.py        # 2 processes (torchrun works too)
    dptrain train --recipe examples/train_your_own.py:make_task --checkpoint-dir runs/own   # the CLI

A small regression network learns y = sin(3 x1) + x2^2 from data this file makes; AdamW
with a cosine schedule stepped per batch; mean absolute error as an extra metric.
"""
from __future__ import annotations

import argparse
import functools

import torch
from torch import nn
from torch.utils.data import TensorDataset

import dptrain


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g) * 2 - 1
    y = torch.sin(3 * X[:, :1]) + X[:, 1:] ** 2 + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(X, y)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))


def mean_absolute_error(output: torch.Tensor, target: torch.Tensor):
    """A metric is (sum, count): dptrain adds them over devices and processes, then divides."""
    return (output - target).abs().sum(), target.numel()


def make_task(config=None, epochs: int = 8, batches_per_epoch: int = 40, batch_size: int = 64) -> dptrain.Task:
    """The whole job as a Task: what ``dptrain train --recipe this_file.py:make_task`` runs
    (``config`` is the command line's ``TrainConfig``: its ``--epochs`` sizes the schedule)."""
    torch.manual_seed(0)
    epochs = config.epochs if config is not None and config.epochs else epochs
    steps = epochs * batches_per_epoch
    return dptrain.Task(
        model=make_model(),
        train_data=make_data(batches_per_epoch * batch_size, seed=1),
        eval_data=make_data(1000, seed=2),
        loss=nn.MSELoss(),
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-3, weight_decay=1e-4),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=steps),
        scheduler_interval="batch",
        metrics={"mae": mean_absolute_error},
        epochs=epochs, batch_size=batch_size, name="train-your-own")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    task = make_task(epochs=args.epochs)
    result = dptrain.fit(task.model, task.train_data, task.eval_data, loss=task.loss, optimizer=task.optimizer,
                         scheduler=task.scheduler, scheduler_interval="batch", metrics=task.metrics,
                         epochs=args.epochs, batch_size=task.batch_size, devices=args.devices,
                         checkpoint_dir=args.checkpoint_dir, resume=args.resume, name=task.name)
    if dptrain.rank() == 0:      # every process gets the result; one prints it
        print(f"test mae {result['test_mae']:.3f} after {args.epochs} epochs")


if __name__ == "__main__":
    main()
