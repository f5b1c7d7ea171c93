"""A user's own Task for the CLI tests: ``dptrain train --recipe tests/tasks/user_task.py:make``.

A small MLP, AdamW with a per-batch cosine schedule, dict batches from a map-style Dataset,
and an extra metric: everything a recipe does, through the public API only.
"""
import functools

import torch
from torch import nn
from torch.utils.data import Dataset

import dptrain


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, :3].sum(1) > 0).long() + (self.x[:, 3] > 1).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.y[i]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))

    def forward(self, features):
        return self.body(features)


def make(config):
    n = 16 * (config.max_batches or 50)
    return dptrain.Task(
        Net(), Pairs(n, 1), Pairs(100, 2), loss=nn.CrossEntropyLoss(),
        optimizer=functools.partial(torch.optim.AdamW, lr=0.01),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=1000),
        scheduler_interval="batch", metrics={"zeros": lambda out, y: ((y == 0).sum(), y.numel())},
        batch_size=16, epochs=2, name="user-task")


def data():
    """For --data: (train, eval) Datasets of dicts."""
    return Pairs(320, 1), Pairs(50, 2)


def flat_data(config):
    """For --data with a plain model: tensors (X, y), given the config (its --seed here)."""
    p = Pairs(320, config.seed)
    return (p.x, p.y), (p.x[:50], p.y[:50])


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def make_slow(config):
    """The same task with a step that takes a second: a signal lands inside a batch."""
    import time

    def step(model, batch):
        time.sleep(1.0)
        return nn.functional.cross_entropy(model(batch["features"]), batch["label"])
    task = make(config)
    return dptrain.Task(task.model, task.train_data, step=step, optimizer=task.optimizer, batch_size=16,
                        epochs=1, name="user-task-slow")
