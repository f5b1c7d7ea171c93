"""A user's own Task for the CLI tests: ``dptrain train --recipe tests/tasks/user_task.py:make``.

A small MLP, AdamW with a per-batch cosine schedule, dict batches from a map-style Dataset
whose training samples are augmented with noise from torch, NumPy and Python's ``random``
(a resumed run, a fresh interpreter, must draw what the unbroken one drew), and an extra
metric: everything a recipe does, through the public API only.
"""
import functools
import os
import random

import numpy as np

import torch
from torch import nn
from torch.utils.data import Dataset

import dptrain


class Pairs(Dataset):
    def __init__(self, n, seed, noise=0.0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, :3].sum(1) > 0).long() + (self.x[:, 3] > 1).long()
        self.noise = noise

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        if self.noise:
            x = x + self.noise * (torch.randn(6) + float(np.random.randn()) + random.gauss(0.0, 1.0))
        return {"features": x, "label": self.y[i]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))

    def forward(self, features):
        return self.body(features)


def make(config):
    n = 16 * (config.max_batches or 50)
    return dptrain.Task(
        Net(), Pairs(n, 1, noise=0.05), Pairs(100, 2), loss=nn.CrossEntropyLoss(),
        optimizer=functools.partial(torch.optim.AdamW, lr=0.01),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=1000),
        scheduler_interval="batch", metrics={"zeros": lambda out, y: ((y == 0).sum(), y.numel())},
        batch_size=16, epochs=2, name="user-task")


def data():
    """For --data: (train, eval) Datasets of dicts."""
    return Pairs(320, 1), Pairs(50, 2)


def train_only():
    """For --data with --validation-split: the training Dataset alone."""
    return Pairs(320, 1)


class StuckAt(Pairs):
    """Sample 5 never comes back: a reader stuck in __getitem__ (a dead network share, a lock)."""

    def __getitem__(self, i):
        if i == 5:
            import time
            time.sleep(3600)
        return super().__getitem__(i)


def stuck_data():
    """For --data: a training set one of whose samples hangs its reader."""
    return StuckAt(64, 1), None


def flat_data(config):
    """For --data with a plain model: tensors (X, y), given the config (its --seed here)."""
    p = Pairs(320, config.seed)
    return (p.x, p.y), (p.x[:50], p.y[:50])


class EndlessPairs(torch.utils.data.IterableDataset):
    """Pairs' samples over and over: a stream with no end (--steps-per-epoch)."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __iter__(self):
        while True:
            yield from zip(self.pairs.x, self.pairs.y)


def stream_data(config):
    """For --data: an endless stream to train on, tensors to evaluate on."""
    p = Pairs(320, config.seed)
    return EndlessPairs(p), (p.x[:50], p.y[:50])


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def regressor():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))


def regression():
    """For --loss mse: tensors (X, y) with one value per sample."""
    p = Pairs(200, 3)
    y = p.x[:, :2].sum(1, keepdim=True)
    return (p.x, y), (p.x[:40], y[:40])


def make_slow(config):
    """The same task with a step that takes a second and says when it begins: a signal sent
    after that line lands inside a batch, however slowly the process started."""
    import sys
    import time

    def step(model, batch):
        print("a step begins", file=sys.stderr, flush=True)
        time.sleep(1.0)
        return nn.functional.cross_entropy(model(batch["features"]), batch["label"])
    task = make(config)
    return dptrain.Task(task.model, task.train_data, step=step, optimizer=task.optimizer, batch_size=16,
                        epochs=1, name="user-task-slow")


class StopWhenFlat(dptrain.Callback):
    """A user's early stopping: end the run once the test loss has not improved by
    ``min_delta`` for ``patience`` epochs."""

    def __init__(self, patience=3, min_delta=0.0):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.wait, self.seen = float("inf"), 0, []

    def on_epoch_end(self, run, epoch, row):
        self.seen.append(epoch)
        if row["test_loss"] < self.best - self.min_delta:
            self.best, self.wait = row["test_loss"], 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                run.stop(f"test loss not better for {self.patience} epochs")

    def state_dict(self):
        return {"best": self.best, "wait": self.wait, "seen": self.seen}

    def load_state_dict(self, state):
        self.best, self.wait, self.seen = state["best"], state["wait"], list(state["seen"])


class LogLearningRate(dptrain.Callback):
    """A user's logger: the learning rate every ``every`` batches (rank 0 prints; every rank
    keeps the record, so checkpoints carry it)."""

    def __init__(self, every=50):
        self.every, self.logged = every, []

    def on_batch_end(self, run, batch):
        if batch.step % self.every == 0:
            lr = run.optimizer.param_groups[0]["lr"]
            self.logged.append([batch.step, lr])
            run.log(f"step {batch.step}: lr {lr:.6g}")

    def state_dict(self):
        return {"logged": self.logged}

    def load_state_dict(self, state):
        self.logged = [list(x) for x in state["logged"]]


def make_with_callbacks(config):
    """``make`` with the two callbacks above; the test loss must improve by 10 to count, so
    the run stops after epoch 4 (1 + patience 3)."""
    task = make(config)
    task.callbacks = [StopWhenFlat(patience=3, min_delta=10.0), LogLearningRate(every=50)]
    task.epochs = 6
    return task


def make_with_builtin_callbacks(config):
    """``make`` with dptrain's EarlyStopping (stops after epoch 4: the loss must improve by
    10; restores epoch 1's weights at the end), BestCheckpoint (into the checkpoint folder)
    and EMA (evaluated: the test figures are the average's)."""
    import os
    from dptrain.callbacks import EMA, BestCheckpoint, EarlyStopping
    task = make(config)
    task.callbacks = [EarlyStopping("test_loss", patience=3, min_delta=10.0, restore_best_weights=True),
                      BestCheckpoint(os.path.join(config.checkpoint_dir, "best.pt"), monitor="test_acc"),
                      EMA(decay=0.99, evaluate=True)]
    task.epochs = 6
    return task


def make_failing_on_rank_1(config):
    """A recipe whose data factory raises on rank 1 only (rank 0 is then stopped by the agent)."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1's data factory broke")
    return make(config)
