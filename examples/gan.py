"""A GAN: two optimizers taking turns on every batch, in one fit call.

    python examples/gan.py                                   # all GPUs, else the CPU
    python examples/gan.py --devices 2 --checkpoint-dir runs/gan
    python examples/gan.py --devices 2 --checkpoint-dir runs/gan --epochs 50 --resume   # 10 more epochs
    dptrain launch --processes 2 examples/gan.py             # 2 processes (torchrun works too)
    dptrain train --recipe examples/gan.py:make_task --processes 2 --epochs 5   # the Task, from the CLI

The real data are points on a ring of 8 Gaussians (the classic test of whether a GAN covers
every mode). ``step`` and ``optimizer`` are dicts with the same names: each batch runs the
discriminator's step and its Adam update, then the generator's through the updated
discriminator, as a DCGAN script, a Keras ``train_step`` with two optimizers or Lightning's
manual optimization do. Each step's loss is a figure of its own (``train_discriminator_loss``,
``train_generator_loss``), and a callback scores the generator after every epoch.
"""
from __future__ import annotations

import argparse
import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

import dptrain

LATENT, MODES, RADIUS, SPREAD = 8, 8, 2.0, 0.05


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(LATENT, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                       nn.Linear(128, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128),
                                           nn.LeakyReLU(0.2), nn.Linear(128, 1))


def centres() -> torch.Tensor:
    angles = torch.arange(MODES) * 2 * math.pi / MODES
    return RADIUS * torch.stack([angles.cos(), angles.sin()], 1)


def ring(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return centres()[torch.randint(0, MODES, (n,), generator=g)] + SPREAD * torch.randn(n, 2, generator=g)


def bce(logits: torch.Tensor, label: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, label))


def discriminator_step(gan: GAN, real: torch.Tensor) -> torch.Tensor:
    fake = gan.generator(torch.randn(len(real), LATENT, device=real.device)).detach()
    return bce(gan.discriminator(real), 1.0) + bce(gan.discriminator(fake), 0.0)


def generator_step(gan: GAN, real: torch.Tensor) -> torch.Tensor:
    return bce(gan.discriminator(gan.generator(torch.randn(len(real), LATENT, device=real.device))), 1.0)


def score(generator: nn.Module, n: int = 2000) -> Dict[str, float]:
    """``good``: the share of generated points within 4 spreads of a mode; ``modes``: how many
    modes hold at least 2% of them."""
    with torch.no_grad():
        device = next(generator.parameters()).device
        points = generator(torch.randn(n, LATENT, generator=torch.Generator().manual_seed(0)).to(device)).cpu()
    distance, nearest = torch.cdist(points, centres()).min(1)
    good = distance < 4 * SPREAD
    counts = torch.bincount(nearest[good], minlength=MODES)
    return {"good": float(good.float().mean()), "modes": int((counts >= 0.02 * n).sum())}


class Score(dptrain.Callback):
    """The generator's ``good`` and ``modes`` in every epoch's row (and line)."""

    def on_epoch_end(self, run, epoch, row):
        row.update(score(run.model.generator))


def make_task(config=None, samples: int = 8192) -> dptrain.Task:
    """The whole job as a Task: what ``dptrain train --recipe examples/gan.py:make_task`` runs."""
    torch.manual_seed(0)
    gan = GAN()
    adam = dict(lr=1e-3, betas=(0.5, 0.999))
    return dptrain.Task(
        model=gan, train_data=ring(samples, seed=1),
        step={"discriminator": discriminator_step, "generator": generator_step},
        optimizer={"discriminator": torch.optim.Adam(gan.discriminator.parameters(), **adam),
                   "generator": torch.optim.Adam(gan.generator.parameters(), **adam)},
        callbacks=[Score()], epochs=40, batch_size=256, name="gan")


def arguments(argv: Optional[List[str]], doc: str) -> argparse.Namespace:
    """The examples' GAN settings (this one's and lightning_gan.py's)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", action="store_true")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> dict:
    args = arguments(argv, __doc__)
    task = make_task(samples=args.samples)
    return dptrain.fit(task.model, task.train_data, step=task.step, optimizer=task.optimizer,
                       callbacks=task.callbacks, batch_size=task.batch_size, epochs=args.epochs,
                       devices=args.devices, checkpoint_dir=args.checkpoint_dir, resume=args.resume)


def report(result: dict) -> None:
    """The last epoch's score of the generator, on rank 0."""
    if dptrain.rank() == 0:
        last = result["history"][-1]
        print(f"generated points near a mode: {last['good']:.0%}, modes covered: {last['modes']} of {MODES}")


if __name__ == "__main__":
    report(main())
