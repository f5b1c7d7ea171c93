"""What the per-step stop flags cost in a 2-process run, and gloo's small-message latency.

    python benchmarks/bench_stop_flags.py --data-dir ../shared/datasets

Two processes (gloo, loopback, 1 thread each) train lenet-scratch on their halves of 40
batches of 256. Each step is timed in three parts: ``before_batch`` (send the flags),
``train_batch`` and ``after_batch`` (read the answer); then the same steps without the flags.
Also the flags sent and read with no batch between (what a blocking agreement would cost),
then the latency of one blocking ``all_reduce`` of 3, 1,000 and 100,000 floats. Medians
(and means, where a slow tail matters), ms.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.distributed.helpers import run_workers  # noqa: E402


def _ms(values):
    return round(statistics.median(values) * 1e3, 3)


def worker(rank, world, data_dir, repeats):
    import dptrain
    from dptrain.data import ArrayLoader, load_dataset
    from dptrain.distributed import get_collective
    from dptrain.models import lenet, lenet_params
    from dptrain.run.stopping import StopRequests
    data = load_dataset("fashion-mnist", data_dir)
    loader = ArrayLoader(data.train_X, data.train_y, 256, shuffle=True, max_batches=40, rank=rank, world_size=world)
    batches = list(loader)
    dp = dptrain.ScratchDataParallel(lenet, lenet_params(), [dptrain.cpu(0)])
    stops = StopRequests(get_collective())
    send, step, read, plain, sync = [], [], [], [], []
    for _ in range(repeats):
        for X, y in batches:
            t0 = time.perf_counter()
            stops.before_batch()
            t1 = time.perf_counter()
            loss = dp.train_batch(X, y, 0.2)
            t2 = time.perf_counter()
            stops.after_batch(1, not torch.isfinite(loss))
            t3 = time.perf_counter()
            send.append(t1 - t0), step.append(t2 - t1), read.append(t3 - t2)
            sync.append(time.perf_counter())
            stops.before_batch()
            stops.after_batch(1, False)               # the flags without a batch between: blocking
            sync[-1] = time.perf_counter() - sync[-1]
        stops.flush()
        for X, y in batches:
            t0 = time.perf_counter()
            dp.train_batch(X, y, 0.2)
            plain.append(time.perf_counter() - t0)
    out = {"send_ms": _ms(send), "read_ms": _ms(read), "blocking_flags_mean_ms": round(statistics.mean(sync) * 1e3, 3),
           "step_with_flags_ms": _ms(step),
           "step_without_flags_ms": _ms(plain)}
    for n in (3, 1000, 100_000):
        t = torch.zeros(n)
        for _ in range(20):
            dist.all_reduce(t)
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        out[f"all_reduce_{n}_floats_ms"] = {"median": _ms(times), "mean": round(statistics.mean(times) * 1e3, 3)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    print(json.dumps(run_workers(worker, args.data_dir, args.repeats, timeout=900)[0], indent=1))


if __name__ == "__main__":
    main()
