"""Benchmark lenet-scratch: dptrain on 1 and 2 devices against plain PyTorch loops, one script.

    python benchmarks/bench_lenet_scratch.py --data-dir ../shared/datasets            # step timings
    python benchmarks/bench_lenet_scratch.py --data-dir ../shared/datasets --epochs 10  # + full runs

Step timings: every variant trains on the same batches (batch 256, lr 0.2); the variants take
turns within each repetition so machine noise hits them alike; after a warm-up, the median
of the repetitions is reported. Peers:
- ``plain-functional``: the best hand-written PyTorch loop on the same model (dptrain's
  ``lenet`` function, same parameters), all cores, manual SGD: what dptrain's 1-device path
  must match within 5%.
- ``plain-module``: what a PyTorch user writes first: ``nn.Module`` LeNet, ``optim.SGD``.
"""
from __future__ import annotations

import argparse
import json
import platform

import torch
from common import measure, paired
import torch.nn.functional as F

import dptrain
from dptrain.run.config import TrainConfig
from dptrain.data import ArrayLoader, load_dataset
from dptrain.models import ScratchLeNet, lenet, lenet_params
from dptrain.core.runner import get_runner
from dptrain.recipes import train


def dptrain_variant(n_devices):
    devices = [dptrain.cpu(i) for i in range(n_devices)]
    dp = dptrain.ScratchDataParallel(lenet, lenet_params(), devices)
    runner = get_runner(devices)

    def run(batches):
        with runner.coordinating():
            for X, y in batches:
                dp.train_batch(X, y, 0.2)
    return run


def plain_functional():
    params = [p.requires_grad_() for p in lenet_params()]

    def run(batches):
        for X, y in batches:
            loss = F.cross_entropy(lenet(X, params), y, reduction="sum")
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(g, alpha=0.2 / len(X))
    return run


def plain_module():
    net = ScratchLeNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.2)

    def run(batches):
        for X, y in batches:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(X), y).backward()
            opt.step()
    return run


def step_timings(data, n_batches, repeats):
    loader = ArrayLoader(data.train_X, data.train_y, 256, shuffle=True, max_batches=n_batches)
    variants = {"dptrain-2dev": dptrain_variant(2), "dptrain-1dev": dptrain_variant(1),
                "plain-functional": plain_functional(), "plain-module": plain_module()}
    return measure(variants, loader, repeats)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=0, help="also run full trainings of this many epochs")
    ap.add_argument("--out", help="write the JSON result here")
    args = ap.parse_args()
    data = load_dataset("fashion-mnist", args.data_dir)
    medians, raw = step_timings(data, args.batches, args.repeats)
    result = {"machine": f"{platform.processor() or platform.machine()}, {dptrain.core.devices.host_cores()} cores, "
                         f"torch {torch.__version__}",
              "images_per_sec_median": medians, "images_per_sec_all": raw}
    result["paired"] = {"2dev/1dev": paired(raw, "dptrain-2dev", "dptrain-1dev"),
                        "1dev/plain-functional": paired(raw, "dptrain-1dev", "plain-functional"),
                        "1dev/plain-module": paired(raw, "dptrain-1dev", "plain-module")}
    print(json.dumps(medians, indent=1))
    print(json.dumps(result["paired"], indent=1))
    if args.epochs:
        result["full_runs"] = {}
        for devices in ("1", "2"):
            r = train(TrainConfig(devices=devices, epochs=args.epochs, data_dir=args.data_dir))
            result["full_runs"][devices] = {k: r[k] for k in ("test_acc", "sec_per_epoch", "images_per_sec")}
            result["full_runs"][devices]["history"] = r["history"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
