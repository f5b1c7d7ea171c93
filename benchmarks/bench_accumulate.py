"""Gradient accumulation: 4 micro-batches of 256 against one batch of 1024, speed and memory.

    python benchmarks/bench_accumulate.py --data-dir ../shared/datasets --out benchmarks/results/accumulate.json

The same update either way (``tests/run/test_accumulation.py`` proves it): ``fit(batch_size=1024)``
against ``fit(batch_size=256, accumulate_grad_batches=4)``, on 1 and 2 virtual CPU devices,
training a small CNN whose activations dominate its memory (conv 1-32-64, 3x3, on
Fashion-MNIST, 4096 images). Each variant runs in a fresh process, so its peak resident
memory (``ru_maxrss``) is its own; "training memory" is that peak less the resident memory
once the data and model are loaded. Speed: the median epoch of 3 after a warm-up epoch, in
images/s. The variants take turns ``--repeats`` times; ratios are paired within a turn.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

from common import save_result

VARIANTS = {"batch 1024": (1024, 1), "4 x 256 accumulated": (256, 4)}


def model():
    from torch import nn
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 12 * 12, 10))


def child(data_dir: str, batch: int, k: int, devices: int, n: int) -> None:
    import torch
    import dptrain
    from dptrain.data import load_dataset
    torch.manual_seed(0)
    fashion = load_dataset("fashion-mnist", data_dir)
    X, y = fashion.train_X[:n].float().div(255), fashion.train_y[:n]
    net = model()
    rss_before = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    result = dptrain.fit(net, (X, y), epochs=4, batch_size=batch, accumulate_grad_batches=k, devices=devices,
                         optimizer="sgd", lr=0.05, channels_last=False, log=None, progress=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"images_per_sec": statistics.median(n / h["sec"] for h in result["history"][1:]),
                      "peak_rss_mb": peak / 2**20, "training_mb": (peak - rss_before) / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.data_dir, *args.child, args.samples)
    raw = {}
    for _ in range(args.repeats):
        for devices in (1, 2):
            for name, (batch, k) in VARIANTS.items():
                out = subprocess.run([sys.executable, __file__, "--data-dir", args.data_dir, "--samples",
                                      str(args.samples), "--child", str(batch), str(k), str(devices)],
                                     check=True, capture_output=True, text=True).stdout
                raw.setdefault(f"{devices} device(s), {name}", []).append(json.loads(out.splitlines()[-1]))
    summary, ratios = {}, {}
    for key, runs in raw.items():
        summary[key] = {m: round(statistics.median(r[m] for r in runs), 1) for m in runs[0]}
    for devices in (1, 2):
        acc, big = raw[f"{devices} device(s), 4 x 256 accumulated"], raw[f"{devices} device(s), batch 1024"]
        ratios[f"{devices} device(s): accumulated / one batch, images/s"] = round(statistics.median(
            a["images_per_sec"] / b["images_per_sec"] for a, b in zip(acc, big)), 3)
        ratios[f"{devices} device(s): accumulated / one batch, training memory"] = round(statistics.median(
            a["training_mb"] / b["training_mb"] for a, b in zip(acc, big)), 3)
    save_result({"median": summary, "paired_ratios": ratios, "raw": raw},
                f"python benchmarks/bench_accumulate.py --data-dir {args.data_dir} --repeats {args.repeats}", args.out)

if __name__ == "__main__":
    main()
