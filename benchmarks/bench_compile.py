"""--compile against eager on this CPU, and how close the training runs to the CPU's matmul.

    python benchmarks/bench_compile.py --data-dir ../shared/datasets --out benchmarks/results/compile.json

In one run, taking turns: ``lenet-scratch`` and the tutorial LeNet (``lenet-mnist`` on
Fashion-MNIST, the Trainer path) on 2 virtual CPU devices, eager and ``--compile``; the
figure is the last epoch's images/s (compiling happens before the first epoch, timed apart).
GFLOP/s: 13.5 MFLOP per image for the from-scratch LeNet's forward and backward (the count
of its layers as the reference defines them), against a 2048x2048 float32 matmul timed in
this script with the same threads.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from dptrain.run.config import TrainConfig
from dptrain.recipes import RECIPES
from dptrain.run.session import run_task

LENET_MFLOP = 13.5


def matmul_gflops(repeats: int = 20) -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * 2048 ** 3 / statistics.median(times) / 1e9


def run(recipe: str, compile, args) -> dict:
    config = TrainConfig(recipe=recipe, data_dir=args.data_dir, dataset="fashion-mnist", devices="2", epochs=2,
                         max_batches=args.batches, progress=False, compile=compile)
    torch.manual_seed(0)
    task = dataclasses.replace(RECIPES[recipe].make(config), eval_data=None)
    result = run_task(task, config, log=None)
    return {"images_per_sec": args.batches * result["batch_size"] / result["history"][-1]["sec"],
            "compile_sec": result.get("compile_sec", 0.0)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    variants = {(r, c): None for r in ("lenet-scratch", "lenet-mnist") for c in (None, "default")}
    raw = {k: [] for k in variants}
    compile_sec = {}
    names = list(variants)
    matmul = []
    for rep in range(args.repeats + 1):
        matmul.append(matmul_gflops())
        shift = rep % len(names)
        for key in names[shift:] + names[:shift]:
            result = run(key[0], key[1], args)
            if rep:
                raw[key].append(result["images_per_sec"])
            if key[1]:
                compile_sec.setdefault(key[0], []).append(result["compile_sec"])
    label = lambda k: f"{k[0]}, {'compiled' if k[1] else 'eager'}"      # noqa: E731
    med = {label(k): round(statistics.median(v)) for k, v in raw.items()}
    ratio = {r: round(statistics.median(a / b for a, b in zip(raw[(r, "default")], raw[(r, None)])), 3)
             for r in ("lenet-scratch", "lenet-mnist")}
    mm = statistics.median(matmul[1:])
    scratch = statistics.median(raw[("lenet-scratch", None)])
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
                   f"torch {torch.__version__}",
        "command": f"python benchmarks/bench_compile.py --data-dir {args.data_dir} --batches {args.batches} "
                   f"--repeats {args.repeats}",
        "images_per_sec_median": med, "compiled_over_eager_paired": ratio,
        "compile_sec_median": {k: round(statistics.median(v), 1) for k, v in compile_sec.items()},
        "matmul_2048_gflops": round(mm, 1),
        "lenet_scratch_eager_gflops": round(scratch * LENET_MFLOP / 1e3, 1),
        "lenet_scratch_eager_fraction_of_matmul": round(scratch * LENET_MFLOP / 1e3 / mm, 3),
        "raw": {label(k): v for k, v in raw.items()},
    }
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
