"""What unfreezing a layer mid-run costs: one ``fit`` whose callback unfreezes the backbone
against the plain loop doing the same, and against fine-tuning in two ``fit`` phases (the
way before); and the rebuild itself (``Trainer.follow``: per-device optimizers and gradient
buckets built again, every optimizer state kept) on a small CNN's backbone and ResNet-18's stem (the rest's Adam state carried over).

A CNN (two conv layers, the backbone, frozen at the start; a linear head) on random 28x28
images; the backbone unfrozen at the start of epoch 2 and given a group of its own at a
tenth of the rate (Lightning's ``BackboneFinetuning``). Variants take turns in each round;
medians of whole-run seconds and of the paired ratios.

    python benchmarks/bench_unfreeze.py --rounds 5 --devices 1,2
    python benchmarks/bench_unfreeze.py --smoke        # CI: one short round
"""
from __future__ import annotations

import functools
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
from torch import nn

import dptrain
from dptrain.models import resnet18
from dptrain.parallel import trainer as trainer_module
from common import rounds_parser, save_result

BATCH, LR = 128, 0.05


def cnn() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))
    net[:6].requires_grad_(False)
    return net


class Unfreeze(dptrain.Callback):
    def on_epoch_start(self, run, epoch):
        if epoch == 2:
            run.model[:6].requires_grad_(True)
            run.optimizer.add_param_group({"params": list(run.model[:6].parameters()), "lr": LR / 10})


def one_fit(X, y, devices: int, epochs: int) -> float:
    net, start = cnn(), time.perf_counter()
    dptrain.fit(net, (X, y), loss=nn.CrossEntropyLoss(), optimizer=functools.partial(torch.optim.SGD, lr=LR,
                momentum=0.9), epochs=epochs, batch_size=BATCH, devices=devices, callbacks=[Unfreeze()], log=None)
    return time.perf_counter() - start


def two_fits(X, y, devices: int, epochs: int) -> float:
    net, start = cnn(), time.perf_counter()
    common = dict(loss=nn.CrossEntropyLoss(), batch_size=BATCH, devices=devices, log=None)
    dptrain.fit(net, (X, y), optimizer=functools.partial(torch.optim.SGD, lr=LR, momentum=0.9), epochs=1, **common)
    net[:6].requires_grad_(True)
    optimizer = torch.optim.SGD([{"params": net[:6].parameters(), "lr": LR / 10}, {"params": net[6:].parameters()}],
                                lr=LR, momentum=0.9)
    dptrain.fit(net, (X, y), optimizer=optimizer, epochs=epochs - 1, **common)
    return time.perf_counter() - start


def plain(X, y, devices: int, epochs: int) -> float:
    net, start = cnn(), time.perf_counter()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=LR, momentum=0.9)
    for epoch in range(1, epochs + 1):
        if epoch == 2:
            net[:6].requires_grad_(True)
            opt.add_param_group({"params": list(net[:6].parameters()), "lr": LR / 10})
        order = torch.randperm(len(X))
        for i in range(0, len(X), BATCH):
            idx = order[i:i + BATCH]
            opt.zero_grad()
            nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
    return time.perf_counter() - start


def rebuild_ms(make: Callable[[], nn.Module], frozen: tuple, devices: int, repeats: int) -> List[float]:
    """Milliseconds of ``Trainer.follow`` unfreezing the parameters named ``frozen...``, after
    an Adam step of the others (whose state it carries over)."""
    times = []
    for _ in range(repeats):
        torch.manual_seed(0)
        net = make()
        for name, p in net.named_parameters():
            p.requires_grad_(not name.startswith(frozen))
        replicas = dptrain.replicate(net, [dptrain.cpu(i) for i in range(devices)])
        replicas.initialize(torch.randn(2, 1, 28, 28), lambda m, x: m(x))
        trainer = dptrain.Trainer(replicas, torch.optim.Adam(net.parameters(), lr=1e-3))
        trainer.follow_edits()
        X, y = torch.randn(2 * devices, 1, 28, 28), torch.randint(0, 10, (2 * devices,))
        replicas.forward_backward(*dptrain.split_batch(X, y, replicas.devices))
        trainer.step(len(X))
        net.requires_grad_(True)
        start = time.perf_counter()
        assert trainer.follow(True)
        times.append(1000 * (time.perf_counter() - start))
        trainer.close()
    return times


def main(argv=None) -> int:
    ap = rounds_parser(__doc__, samples=4096)
    ap.add_argument("--devices", default="1,2")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.epochs, args.samples, args.devices = 1, 2, 512, "2"
    torch.manual_seed(0)
    X, y = torch.randn(args.samples, 1, 28, 28), torch.randint(0, 10, (args.samples,))
    variants = {"dptrain, one fit": one_fit, "dptrain, two fits": two_fits, "plain loop": plain}
    follow, rebuilds = trainer_module.Trainer.follow, []

    def timed_follow(self, *a, **k):
        start = time.perf_counter()
        done = follow(self, *a, **k)
        if done:
            rebuilds.append(1000 * (time.perf_counter() - start))
        return done
    trainer_module.Trainer.follow = timed_follow
    figures: Dict[str, Dict] = {}
    for devices in [int(d) for d in args.devices.split(",")]:
        names = list(variants) if devices == 1 else list(variants)[:2]     # the plain loop: one device
        runs: Dict[str, List[float]] = {n: [] for n in names}
        for r in range(args.rounds + 1):                 # round 0: warm-up
            for name in (names if r % 2 else names[::-1]):
                seconds = variants[name](X, y, devices, args.epochs)
                if r:
                    runs[name].append(seconds)
        base = runs["dptrain, one fit"]
        figures[f"{devices} device(s)"] = {
            "seconds": {n: statistics.median(v) for n, v in runs.items()},
            "one fit faster by (x)": {n: statistics.median(o / b for o, b in zip(v, base))
                                      for n, v in runs.items() if n != "dptrain, one fit"},
            "raw": runs}
    trainer_module.Trainer.follow = follow
    figures["rebuild in fit, ms (median)"] = statistics.median(rebuilds)
    figures["rebuild, ms (median of 3)"] = {
        f"{name}, {d} device(s)": statistics.median(rebuild_ms(make, frozen, d, 1 if args.smoke else 3))
        for name, make, frozen in (("cnn backbone", cnn, ("0.", "3.")),
                                   ("resnet18 stem (the rest's Adam state kept)", lambda: resnet18(10), ("0.", "1.")))
        for d in ([2] if args.smoke else [1, 2])}
    save_result(figures, "python benchmarks/bench_unfreeze.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
