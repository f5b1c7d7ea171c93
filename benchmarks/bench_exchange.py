"""Summing a tensor over 2 processes: dptrain's exchange (isend/irecv + local add) against
gloo's all_reduce, on the same tensors in the same run, quiet and with a busy neighbour.

    python benchmarks/bench_exchange.py --out benchmarks/results/exchange.json

Each run is ``dptrain launch --processes 2`` of this script as a worker: rank r pins itself
to core r, one thread, and sums each size ``--calls`` times back to back with each method,
the methods taking turns in ``--rounds`` rounds (the first warms up). Before each call both
ranks compute for ``--compute-ms`` (a busy loop: a step's forward and backward), so they
arrive together and their cores are not idle, as in training; a call's time is rank 0's
wall time from its arrival, median per round, then the median over the rounds of ``--launches`` launches
(quiet and busy alternate). Latency on this VM falls into slow (~3 ms) and fast rhythms that
last a while, for either method (an idle virtual CPU wakes slowly): hence several launches. Sizes: 1 KB, LeNet's
gradients (60,170 floats: one bucket), 1 MiB (the exchange's limit for 2 processes), 4 MiB
(over it: dptrain leaves such tensors to gloo's ring). ``busy``: a Python busy loop pinned to core 1 (rank 1's core), as in
bench_balance.py.
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
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from bench_balance import neighbour  # noqa: E402

SIZES = {"1 KB": 256, "LeNet 235 KB": 60_170, "1 MiB": 1 << 18, "4 MiB": 1 << 20}


def _compute(ms: float) -> None:
    """Stand-in for a step's forward and backward: the CPU busy for ``ms``."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def worker(args) -> dict:
    rank = int(os.environ["RANK"])
    os.sched_setaffinity(0, {rank})
    import torch
    import torch.distributed as dist

    from dptrain.distributed.exchange import ExchangeWork
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    methods = {"gloo all_reduce": lambda t: dist.all_reduce(t), "exchange": lambda t: ExchangeWork(t).wait()}
    per_round = {f"{s} | {m}": [] for s in SIZES for m in methods}
    for r in range(args.rounds + 1):
        for size, n in SIZES.items():
            tensor = torch.randn(n)
            names = list(methods)[::1 if r % 2 else -1]
            for name in names:
                times = []
                for _ in range(args.calls):
                    _compute(args.compute_ms)
                    start = time.perf_counter()
                    methods[name](tensor)
                    times.append(time.perf_counter() - start)
                    tensor.mul_(0.5)                 # keep the values finite
                if r:
                    per_round[f"{size} | {name}"].append(statistics.median(times) * 1e3)
    dist.destroy_process_group()
    return per_round


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--compute-ms", type=float, default=5.0, help="busy before each call, as a step's compute")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        result = worker(args)
        if os.environ.get("RANK") == "0":
            print(json.dumps(result), flush=True)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, 2 processes x 1 "
                      f"thread pinned to cores 0 and 1, gloo on loopback",
           "command": f"python benchmarks/bench_exchange.py --rounds {args.rounds} --calls {args.calls} "
                      f"--launches {args.launches} --compute-ms {args.compute_ms}",
           "ms_per_call_median": {}, "gloo_over_exchange": {}, "raw": {"quiet": {}, "busy": {}}}
    for _ in range(args.launches):
        for label in ("quiet", "busy"):
            with neighbour(label == "busy"):
                run = subprocess.run([sys.executable, "-m", "dptrain", "launch", "--processes", "2", str(HERE),
                                      "--worker", "--rounds", str(args.rounds), "--calls", str(args.calls),
                                      "--compute-ms", str(args.compute_ms)],
                                     capture_output=True, text=True, env=env, timeout=600)
            if run.returncode != 0:
                raise SystemExit(run.stderr[-3000:])
            for key, ms in json.loads([ln for ln in run.stdout.splitlines() if ln.startswith("{")][-1]).items():
                out["raw"][label].setdefault(key, []).extend(round(x, 3) for x in ms)
    for label, times in out["raw"].items():
        med = {key: round(statistics.median(ms), 3) for key, ms in times.items()}
        out["ms_per_call_median"][label] = med
        for size in SIZES:
            out["gloo_over_exchange"][f"{label} | {size}"] = round(med[f"{size} | gloo all_reduce"] /
                                                                  med[f"{size} | exchange"], 2)
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
