"""Sharpness-Aware Minimization (SAM) in one fit call: the optimizer as its users copy it, on any devices.

    python examples/sharpness_aware.py                       # all GPUs, else the CPU
    python examples/sharpness_aware.py --base adam           # Adam as SAM's base optimizer
    python examples/sharpness_aware.py --no-sam              # the base optimizer alone, to compare
    dptrain launch --processes 2 examples/sharpness_aware.py # 2 processes (torchrun works too)

SAM (Foret et al., 2021) takes two evaluations a step: a backward at the weights, a move up
that gradient to the nearby weights where the loss is highest, a second backward there, and
the base optimizer's step from the first weights with the second gradient. ``SAM`` below has
the shape its users copy (davda54/sam): ``step()`` asserts a closure. ``fit`` finds that once,
and calls the closure before ``step`` as their loops do (``loss.backward();
optimizer.step(closure)``), on every device, the gradients summed over all of them
(``engine/closure_step.py``): N devices and processes train as one device's loop.

The task: points of 8 Gaussian clusters in 16 dimensions, 4 classes, with a fifth of the
training labels flipped at random; an MLP classifies them.
"""
from __future__ import annotations

import argparse
import functools
from typing import Any, Dict, List, Optional

import torch
from torch import nn

import dptrain


class SAM(torch.optim.Optimizer):
    """Sharpness-Aware Minimization around ``base_optimizer`` (a ``torch.optim`` class)."""

    def __init__(self, params, base_optimizer=torch.optim.SGD, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure, but it was not provided"
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.norm(torch.stack([g.norm(2) for g in grads]), 2)
        for group in self.param_groups:         # up to the sharpest nearby weights
            for p in group["params"]:
                if p.grad is not None:
                    self.state[p]["e_w"] = p.grad * (group["rho"] / (norm + 1e-12))
                    p.add_(self.state[p]["e_w"])
        self.zero_grad()
        with torch.enable_grad():
            closure()                           # the gradient there
        for group in self.param_groups:         # back, and the base optimizer's step with it
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(self.state[p]["e_w"])
        self.base_optimizer.step()


def clusters(n: int, seed: int, noise: float = 0.0):
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 16, generator=g) * 2.0
    g.manual_seed(seed)
    which = torch.randint(0, 8, (n,), generator=g)
    X = centres[which] + torch.randn(n, 16, generator=g) * 1.5
    y = which % 4
    flip = torch.rand(n, generator=g) < noise
    return X, torch.where(flip, torch.randint(0, 4, (n,), generator=g), y)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--no-sam", action="store_true", help="the base optimizer alone")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--devices", default="auto")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    base, settings = ((torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}) if args.base == "sgd"
                      else (torch.optim.Adam, {"lr": 2e-3}))
    optimizer = (base(model.parameters(), **settings) if args.no_sam
                 else SAM(model.parameters(), base, rho=0.05, **settings))
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    return dptrain.fit(model, clusters(args.samples, 1, noise=0.2), clusters(2000, 2),
                       optimizer=optimizer, epochs=args.epochs, batch_size=128, devices=devices,
                       scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=args.epochs))


if __name__ == "__main__":
    main()
