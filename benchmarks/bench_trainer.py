"""Benchmark the Trainer path: GluonLeNet and ResNet-18, 1 vs 2 devices, Trainer vs from scratch.

    python benchmarks/bench_trainer.py --data-dir ../shared/datasets --out benchmarks/results/trainer.json
    python benchmarks/bench_trainer.py --data-dir ../shared/datasets --epochs 10   # + full 2-device run

All variants train on the same batches; they take turns within each repetition and the
median over repetitions (after one warm-up) is reported.
- ``trainer-Ndev``: ``ModelEngine`` (replicate + Trainer, kvstore "device"), as
  ``dptrain train --recipe lenet-mnist --dataset fashion-mnist --batch-size 256`` runs it.
- ``scratch-2dev``: ``ScratchDataParallel`` on the *same* module through
  ``torch.func.functional_call``: the from-scratch path the Trainer must stay within 5% of.
- ``plain-module``: a plain PyTorch loop (nn.Module, optim.SGD), one device, all cores.
"""
from __future__ import annotations

import argparse
import copy
import json
import platform

import torch
from common import ModuleEngine, measure, paired
import torch.nn.functional as F
from torch.func import functional_call

import dptrain
from dptrain.run.config import TrainConfig
from dptrain.data import ArrayLoader, load_dataset
from dptrain.models import GluonLeNet, init_normal, resnet18
from dptrain.recipes.builtin import init_xavier
from dptrain.recipes import train

CL = torch.channels_last


def devices(n):
    return [dptrain.cpu(i) for i in range(n)]


def looped(engine, n, lr):
    runner = dptrain.get_runner(devices(n))

    def run(batches):
        with runner.coordinating():
            for X, y in batches:
                engine.train_batch(X, y, lr)
    return run


def trainer_variant(make, init, n, lr):
    torch.manual_seed(0)
    return looped(ModuleEngine(make(), devices(n), lr, init=init), n, lr)


def scratch_variant(make, init, n, lr):
    torch.manual_seed(0)
    net = make().to(memory_format=CL)
    init(net)
    names = [name for name, _ in net.named_parameters()]
    # functional_call swaps a module's parameters while it runs: one module per replica, so
    # the device threads never share one.
    modules = {}

    def model(X, params):
        module = modules.setdefault(id(params[0]), copy.deepcopy(net))
        return functional_call(module, dict(zip(names, params)), (X.contiguous(memory_format=CL),))
    engine = dptrain.ScratchDataParallel(model, [p.detach() for p in net.parameters()], devices(n))
    for rep in engine.replicas:
        model(torch.zeros(1, 1, 28, 28), rep)
    return looped(engine, n, lr)


def plain_variant(make, init, lr):
    torch.manual_seed(0)
    net = make().to(memory_format=CL)
    init(net)
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    def run(batches):
        for X, y in batches:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(X.contiguous(memory_format=CL)), y).backward()
            opt.step()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--lenet-batches", type=int, default=60)
    ap.add_argument("--resnet-batches", type=int, default=2)
    ap.add_argument("--resnet-batch-size", type=int, default=128)
    ap.add_argument("--resnet-repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    data = load_dataset("fashion-mnist", args.data_dir)
    result = {"machine": f"{platform.machine()}, {dptrain.core.devices.host_cores()} cores, torch {torch.__version__}"}

    lenet_loader = ArrayLoader(data.train_X, data.train_y, 256, shuffle=True, max_batches=args.lenet_batches)
    lenet = {"trainer-2dev": trainer_variant(GluonLeNet, init_xavier, 2, 0.1),
             "trainer-1dev": trainer_variant(GluonLeNet, init_xavier, 1, 0.1),
             "scratch-2dev": scratch_variant(GluonLeNet, init_xavier, 2, 0.1),
             "plain-module": plain_variant(GluonLeNet, init_xavier, 0.1)}
    med, raw = measure(lenet, lenet_loader, args.repeats)
    result["gluon_lenet"] = {"images_per_sec": med, "all": raw,
                             "sec_per_epoch": {k: 60000 / v for k, v in med.items()},
                             "paired_2dev_over_1dev": paired(raw, "trainer-2dev", "trainer-1dev"),
                             "paired_trainer_over_scratch": paired(raw, "trainer-2dev", "scratch-2dev")}
    print("GluonLeNet", json.dumps({k: round(v) for k, v in med.items()}))
    print(f"  2dev/1dev {result['gluon_lenet']['paired_2dev_over_1dev']:.3f}, "
          f"trainer/scratch {result['gluon_lenet']['paired_trainer_over_scratch']:.3f}, "
          f"s/epoch 2dev {60000 / med['trainer-2dev']:.2f}")

    resnet_loader = ArrayLoader(data.train_X, data.train_y, args.resnet_batch_size, shuffle=True,
                                max_batches=args.resnet_batches)
    make = lambda: resnet18(10, 1)   # noqa: E731
    resnet = {"trainer-2dev": trainer_variant(make, init_normal, 2, 0.1),
              "trainer-1dev": trainer_variant(make, init_normal, 1, 0.1)}
    med, raw = measure(resnet, resnet_loader, args.resnet_repeats)
    result["resnet18"] = {"images_per_sec": med, "all": raw, "batch_size": args.resnet_batch_size,
                          "paired_2dev_over_1dev": paired(raw, "trainer-2dev", "trainer-1dev")}
    print("ResNet-18", json.dumps({k: round(v, 1) for k, v in med.items()}),
          f"2dev/1dev {result['resnet18']['paired_2dev_over_1dev']:.3f}")

    if args.epochs:
        r = train(TrainConfig(recipe="lenet-mnist", dataset="fashion-mnist", batch_size=256, lr=0.1,
                              devices="2", epochs=args.epochs, data_dir=args.data_dir))
        result["gluon_lenet_full_run"] = {k: r[k] for k in ("test_acc", "sec_per_epoch", "images_per_sec",
                                                            "history", "batch_size", "lr")}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
