"""Imbalanced classes, as Keras and Lightning scripts train them: one file.

    python examples/imbalanced_classes.py                    # all GPUs, else the CPU
    python examples/imbalanced_classes.py --no-sampler       # the same without the weighted sampler
    dptrain launch --processes 2 examples/imbalanced_classes.py   # 2 processes (torchrun works too)

Three classes, 90%, 8% and 2% of the samples. A ``WeightedRandomSampler`` in the
``DataLoader`` draws each class equally often (dptrain draws its indices by seed and epoch in
every process and cuts them into the global batches: the same run on any number of devices
and processes); the rare class's recall is a metric of its own, ``(sum, count)``, so it is
exact over the whole evaluation set; ``ReduceLROnPlateau`` decides on an evaluation every 25
updates; the weights with the best rare-class recall are restored at the end.
"""
from __future__ import annotations

import argparse
import functools
from typing import Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import dptrain
from dptrain.callbacks import EarlyStopping

SHARES = (0.90, 0.08, 0.02)


def blobs(n: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` points in 8 dimensions around three overlapping centres, in the classes' shares."""
    g = torch.Generator().manual_seed(seed)
    y = torch.multinomial(torch.tensor(SHARES), n, replacement=True, generator=g)
    centres = torch.tensor([[0.0] * 8, [1.5] + [0.0] * 7, [0.0, 1.5] + [0.0] * 6])
    return centres[y] + torch.randn(n, 8, generator=g), y


def rare_recall(output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rarest class's recall, as (found, present): summed over devices and processes."""
    rare = target == 2
    return (output.argmax(1)[rare] == 2).sum(), rare.sum()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--no-sampler", action="store_true", help="shuffle instead of drawing by weights")
    parser.add_argument("--devices", default="auto")
    args = parser.parse_args(argv)
    X, y = blobs(args.samples, seed=0)
    train = TensorDataset(X, y)
    counts = torch.bincount(y, minlength=3).double()
    sampler = WeightedRandomSampler((1.0 / counts)[y], num_samples=len(y))      # each class a third of the draws
    data = DataLoader(train, batch_size=256, shuffle=args.no_sampler, sampler=None if args.no_sampler else sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3))
    result = dptrain.fit(
        model, data, blobs(4000, seed=1), loss=nn.CrossEntropyLoss(), devices=args.devices, epochs=args.epochs,
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), metrics={"rare_recall": rare_recall},
        scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=2, factor=0.5),
        scheduler_interval="batch", eval_every_n_steps=25,
        callbacks=[EarlyStopping("test_rare_recall", patience=8, restore_best_weights=True)])
    print(f"rare class recall {result['test_rare_recall']:.3f}, accuracy {result['test_acc']:.3f}"
          f"{' (no sampler)' if args.no_sampler else ''}")
    return result


if __name__ == "__main__":
    main()
