"""Gradient clipping's cost: ``fit(clip_grad_norm=...)`` (``--mode value``:
``fit(clip_grad_value=...)``) against the same run without it.

    python benchmarks/bench_clip.py --data-dir ../shared/datasets --out benchmarks/results/clip.json
    python benchmarks/bench_clip.py --data-dir ../shared/datasets --mode value --out benchmarks/results/clip_value.json

Two programs, each on 1 and 2 virtual CPU devices: the Gluon tutorial's LeNet on
Fashion-MNIST (batch 256, SGD 0.04) and a tiny MLP (32-64-4, batch 128, tensors in memory),
where the per-step host cost of clipping shows most; and, as the reference of what clipping
costs anyway, the plain PyTorch loop of each on one device with and without
``torch.nn.utils.clip_grad_norm_`` (``clip_grad_value_``). Clipping at a norm (a value) small
enough to clip every step (the work is the same whether it clips or not). Variants take turns
``--repeats`` times; each figure is the median epoch (of 3, after one warm-up epoch) in
images/s; ratios are paired (clip on / off in the same turn).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import dptrain
from dptrain.data import load_dataset
from dptrain.models import GluonLeNet
from dptrain.recipes import init_xavier

from common import save_result


def programs(data_dir):
    fashion = load_dataset("fashion-mnist", data_dir)
    n = 256 * 60
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(128 * 200, 32, generator=g), torch.randint(0, 4, (128 * 200,), generator=g)
    return {
        "lenet": (lambda: GluonLeNet(), (fashion.train_X[:n], fashion.train_y[:n]), 256, dict(init=init_xavier, lr=0.04)),
        "tiny-mlp": (lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)), (X, y), 128, {}),
    }


def one_run(make, data, batch, devices, clip, extra, mode="norm"):
    torch.manual_seed(0)
    result = dptrain.fit(make(), data, loss=nn.CrossEntropyLoss(), optimizer="sgd", epochs=4, batch_size=batch,
                         devices=devices, log=None, progress=False, **{f"clip_grad_{mode}": clip}, **extra)
    return statistics.median(len(data[0]) / h["sec"] for h in result["history"][1:])


def plain_run(make, data, batch, clip, mode="norm"):
    """The plain loop: one device, SGD, clip_grad_norm_ (clip_grad_value_) or not; median
    epoch of 3 after one."""
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.04)
    X, y = data
    rates = []
    for epoch in range(4):
        start = time.perf_counter()
        for i in range(0, len(X), batch):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(X[i:i + batch]), y[i:i + batch]).backward()
            if clip:
                getattr(torch.nn.utils, f"clip_grad_{mode}_")(model.parameters(), clip)
            opt.step()
        if epoch:
            rates.append(len(X) / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mode", choices=["norm", "value"], default="norm")
    ap.add_argument("--out")
    args = ap.parse_args()
    progs = programs(args.data_dir)
    raw = {}
    for _ in range(args.repeats):
        for name, (make, data, batch, extra) in progs.items():
            for devices in (1, 2):
                for clip in (None, 1e-3):
                    key = f"{name}, {devices} device(s), clip {'on' if clip else 'off'}"
                    raw.setdefault(key, []).append(one_run(make, data, batch, devices, clip, extra, args.mode))
            for clip in (None, 1e-3):
                key = f"{name}, plain loop, clip {'on' if clip else 'off'}"
                raw.setdefault(key, []).append(plain_run(make, data, batch, clip, args.mode))
    ratios = {}
    for name in progs:
        for where in ("1 device(s)", "2 device(s)", "plain loop"):
            on, off = raw[f"{name}, {where}, clip on"], raw[f"{name}, {where}, clip off"]
            ratios[f"{name}, {where}: on / off"] = round(statistics.median(a / b for a, b in zip(on, off)), 3)
    save_result({"images_per_sec_median": {k: round(statistics.median(v)) for k, v in raw.items()},
                 "paired_ratios": ratios, "raw": raw},
                f"python benchmarks/bench_clip.py --data-dir {args.data_dir} --repeats {args.repeats} --mode "
                f"{args.mode}", args.out)

if __name__ == "__main__":
    main()
