"""--balance auto against --balance even, 2 processes, with and without a busy neighbour.

    python benchmarks/bench_balance.py --data-dir ../shared/datasets --out benchmarks/results/balance.json

Each run is ``dptrain launch --processes 2`` of this script as a worker: rank r pins itself to
core r and trains the Gluon tutorial's LeNet on Fashion-MNIST with ``dptrain.fit`` (in memory,
global batch 256, SGD at 0.04, one thread per process, gloo on loopback), 2 epochs of
``--batches`` batches; the second epoch's images/s is reported. The neighbour is a Python
busy loop pinned to core 1, so rank 1 gets about half its core.

- ``busy even`` / ``busy auto``: the neighbour running, each split;
- ``alone core 0`` / ``alone core 1``: one process of the same work on its core, neighbour
  running; their sum is the ideal for two processes (what perfect balance and free
  communication would give);
- ``quiet even`` / ``quiet auto``: no neighbour (auto must cost nothing);
- ``... ring``: the same with gloo's all_reduce for the gradients instead of dptrain's
  exchange (distributed/exchange.py), i.e. dptrain before the exchange.

Variants take turns in every repetition; medians and paired ratios over ``--repeats``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve()
BUSY = "import os; os.sched_setaffinity(0, {1})\nwhile True: pass"


def worker(args) -> dict:
    os.sched_setaffinity(0, {int(os.environ.get("LOCAL_RANK", args.core))})
    import torch

    import dptrain
    from dptrain.models import GluonLeNet
    from dptrain.recipes.builtin import init_xavier
    torch.set_num_threads(1)
    if args.ring:
        from dptrain.distributed import exchange
        exchange.MAX_BYTES = 0
    data = dptrain.load_dataset("fashion-mnist", args.data_dir)
    n = args.batches * 256
    torch.manual_seed(0)
    result = dptrain.fit(GluonLeNet(), (data.train_X[:n], data.train_y[:n]), init=init_xavier, lr=0.04,
                         batch_size=256, epochs=2, devices=1, balance=args.balance, log=None, progress=False,
                         trace=args.trace, trace_steps=4)
    return {"images_per_sec": n / result["history"][-1]["sec"], "split": result["history"][-1].get("split")}


@contextmanager
def neighbour(busy: bool):
    proc = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        time.sleep(0.2 if busy else 0)
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def run(args, processes: int, balance: str, core: int = 0, ring: bool = False) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    worker_args = [str(HERE), "--worker", "--data-dir", args.data_dir, "--batches", str(args.batches),
                   "--balance", balance, "--core", str(core)] + ["--ring"] * ring
    command = [sys.executable, "-m", "dptrain", "launch", "--processes", "2", *worker_args] if processes == 2 \
        else [sys.executable, *worker_args]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{command} failed:\n{out.stderr[-3000:]}")
    return json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])


VARIANTS = {    # name: (neighbour, processes, balance, core, gloo's ring)
    "busy even": (True, 2, "even", 0, False), "busy auto": (True, 2, "auto", 0, False),
    "alone core 0": (True, 1, "even", 0, False), "alone core 1": (True, 1, "even", 1, False),
    "quiet even": (False, 2, "even", 0, False), "quiet auto": (False, 2, "auto", 0, False),
    "busy even ring": (True, 2, "even", 0, True), "busy auto ring": (True, 2, "auto", 0, True),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--balance", default="even")
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--ring", action="store_true", help="(with --worker) gloo's all_reduce, no exchange")
    parser.add_argument("--trace", help="(with --worker) write a --trace of steps 2-5 there")
    parser.add_argument("--variants", help="comma-separated names to run (default: all; the ratios need theirs)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        result = worker(args)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(result), flush=True)
        return
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores")
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    raw = {k: [] for k in names}
    splits = {k: [] for k in names}
    for rep in range(args.repeats + 1):          # repetition 0 warms up
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            busy, processes, balance, core, ring = VARIANTS[name]
            with neighbour(busy):
                result = run(args, processes, balance, core, ring)
            if rep:
                raw[name].append(result["images_per_sec"])
                splits[name].append(result["split"])
            print(rep, name, round(result["images_per_sec"]), result["split"], file=sys.stderr, flush=True)
    med = {k: round(statistics.median(v)) for k, v in raw.items()}
    ideal = [a + b for a, b in zip(raw.get("alone core 0", []), raw.get("alone core 1", []))]

    def ratio(a, b):
        pairs = [x / y for x, y in zip(a, b)]
        return round(statistics.median(pairs), 3) if pairs else None
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"2 processes x 1 thread pinned to cores 0 and 1, gloo on loopback",
        "command": f"python benchmarks/bench_balance.py --data-dir {args.data_dir} --batches {args.batches} "
                   f"--repeats {args.repeats}" + (f" --variants '{args.variants}'" if args.variants else ""),
        "images_per_sec_median": med,
        "ideal_images_per_sec_median": round(statistics.median(ideal)) if ideal else None,
        "busy_auto_over_even": ratio(raw.get("busy auto", []), raw.get("busy even", [])),
        "busy_auto_over_ideal": ratio(raw.get("busy auto", []), ideal),
        "busy_even_over_ideal": ratio(raw.get("busy even", []), ideal),
        "quiet_auto_over_even": ratio(raw.get("quiet auto", []), raw.get("quiet even", [])),
        "busy_auto_over_auto_ring": ratio(raw.get("busy auto", []), raw.get("busy auto ring", [])),
        "busy_even_over_even_ring": ratio(raw.get("busy even", []), raw.get("busy even ring", [])),
        "busy_auto_ring_over_even_ring": ratio(raw.get("busy auto ring", []), raw.get("busy even ring", [])),
        "split_busy_auto": splits.get("busy auto"), "raw": raw}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
