"""Clipping's cost per step, with nothing else changing: one engine, clipping switched on and off.

    python benchmarks/bench_clip_steps.py --data-dir ../shared/datasets --out benchmarks/results/clip_steps.json
    python benchmarks/bench_clip_steps.py --model tiny-mlp --out benchmarks/results/clip_steps_tiny.json

``bench_clip.py`` compares whole runs, whose trajectories differ (clipped or not), and its
ratios spread over +-4% on this machine. Here one ``ModelEngine`` (the Gluon tutorial's
LeNet, Fashion-MNIST, batch 256, SGD 0.04) trains 20-step turns with ``clip_grad_norm=None``
and ``1e9`` in alternation (a norm never reached: the same work as clipping, the same
trajectory as not clipping). Speed on/off is the median of the turns' paired ratios, after
4 warm-up turns, on 1 and 2 virtual CPU devices (kvstore device). Two more variants: ``norm``
computes the norm without clipping (``log_grad_norm=True``: ``clip_grad_norm=inf``);
``parameters`` also keeps each parameter's (``log_grad_norm="parameters"``:
``norms_by_parameter``) and reads them (``Trainer.grad_norms``) once every 50 steps, as a run
logging every 50 steps does.
``--model tiny-mlp``: issue 22's tiny MLP (batch 128, tensors in memory), where host work shows.
"""
from __future__ import annotations

import argparse
import math
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
from everyday import tiny_data, tiny_mlp


VARIANTS = {"off": (None, False), "on": (1e9, False), "norm": (math.inf, False), "parameters": (math.inf, True)}


def measure(X, y, devices: int, turns: int, model: str = "lenet") -> dict:
    torch.manual_seed(0)
    if model == "lenet":
        task, batch = Task(GluonLeNet(), (), init=init_xavier, optimizer="sgd", lr=0.04), 256
    else:
        task, batch = Task(tiny_mlp(), (), optimizer="sgd", lr=0.1), 128
    engine = ModelEngine(task, [dptrain.cpu(i) for i in range(devices)])
    engine.prepare((X[:1], y[:1]))
    batches = [(X[i:i + batch], y[i:i + batch]) for i in range(0, len(X), batch)]
    seconds: dict = {name: [] for name in VARIANTS}
    with engine.runner.coordinating():
        for turn in range(turns):
            order = list(VARIANTS)[turn % len(VARIANTS):] + list(VARIANTS)[:turn % len(VARIANTS)]
            for name in order:
                engine.clip_grad_norm, engine.trainer.norms_by_parameter = VARIANTS[name]
                start = time.perf_counter()
                for step, one in enumerate(batches, 1):
                    engine.train_batch(one)
                    if name == "parameters" and step % 50 == 0:
                        engine.trainer.grad_norms()
                seconds[name].append(time.perf_counter() - start)
    kept = {name: s[4:] for name, s in seconds.items()}
    off = kept["off"]
    return {**{f"ms_per_step_{name}": 1000 * statistics.median(s) / len(batches) for name, s in kept.items()},
            **{f"speed_{name}_over_off": round(statistics.median(a / b for a, b in zip(off, s)), 4)
               for name, s in kept.items() if name != "off"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", help="where fashion-mnist is (for --model lenet)")
    ap.add_argument("--model", choices=["lenet", "tiny-mlp"], default="lenet")
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.model == "lenet":
        if not args.data_dir:
            ap.error("--model lenet needs --data-dir DIR (where fashion-mnist is)")
        fashion = load_dataset("fashion-mnist", args.data_dir)
        X, y = fashion.train_X[:256 * 20], fashion.train_y[:256 * 20]
    else:
        X, y = tiny_data(128 * 100)
    figures = {f"{d} device(s)": measure(X, y, d, args.turns, args.model) for d in (1, 2)}
    command = f"python benchmarks/bench_clip_steps.py --model {args.model} --turns {args.turns}" + (
        f" --data-dir {args.data_dir}" if args.data_dir else "")
    save_result({"figures": figures}, command, args.out)

if __name__ == "__main__":
    main()
