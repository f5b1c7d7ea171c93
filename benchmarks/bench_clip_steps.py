"""Clipping's cost per step, with nothing else changing: one engine, clipping switched on and off.

    python benchmarks/bench_clip_steps.py --data-dir ../shared/datasets --out benchmarks/results/clip_steps.json

``bench_clip.py`` compares whole runs, whose trajectories differ (clipped or not), and its
ratios spread over +-4% on this machine. Here one ``ModelEngine`` (the Gluon tutorial's
LeNet, Fashion-MNIST, batch 256, SGD 0.04) trains 20-step turns with ``clip_grad_norm=None``
and ``1e9`` in alternation (a norm never reached: the same work as clipping, the same
trajectory as not clipping). Speed on/off is the median of the turns' paired ratios, after
4 warm-up turns, on 1 and 2 virtual CPU devices (kvstore device).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import dptrain
from dptrain.data import load_dataset
from dptrain.engine.model_engine import ModelEngine
from dptrain.engine.task import Task
from dptrain.models import GluonLeNet
from dptrain.recipes import init_xavier

from common import save_result


def measure(X, y, devices: int, turns: int) -> dict:
    torch.manual_seed(0)
    engine = ModelEngine(Task(GluonLeNet(), (), init=init_xavier, optimizer="sgd", lr=0.04),
                         [dptrain.cpu(i) for i in range(devices)])
    engine.prepare((X[:1], y[:1]))
    batches = [(X[i:i + 256], y[i:i + 256]) for i in range(0, len(X), 256)]
    seconds = {"off": [], "on": []}
    with engine.runner.coordinating():
        for turn in range(turns):
            for name in (("off", "on") if turn % 2 else ("on", "off")):
                engine.clip_grad_norm = 1e9 if name == "on" else None
                start = time.perf_counter()
                for batch in batches:
                    engine.train_batch(batch)
                seconds[name].append(time.perf_counter() - start)
    off, on = seconds["off"][4:], seconds["on"][4:]
    return {"ms_per_step_off": 1000 * statistics.median(off) / len(batches),
            "ms_per_step_on": 1000 * statistics.median(on) / len(batches),
            "speed_on_over_off": round(statistics.median(a / b for a, b in zip(off, on)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    fashion = load_dataset("fashion-mnist", args.data_dir)
    X, y = fashion.train_X[:256 * 20], fashion.train_y[:256 * 20]
    figures = {f"{d} device(s)": measure(X, y, d, args.turns) for d in (1, 2)}
    save_result({"figures": figures},
                f"python benchmarks/bench_clip_steps.py --data-dir {args.data_dir} --turns {args.turns}", args.out)

if __name__ == "__main__":
    main()
