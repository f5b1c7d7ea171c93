"""Benchmark multi-process training against one process and against PyTorch DDP, one script.

    python benchmarks/bench_processes.py --data-dir ../shared/datasets --out benchmarks/results/processes.json

For lenet-scratch (batch 256), the Gluon tutorial's LeNet through the Trainer (batch 256) and
ResNet-18 (batch 32), on the same batches, each through the engine ``dptrain train`` builds for
it (lenet-scratch: the reference's function over its parameter list, the hand-written allreduce
between devices) with the training loop's stop flags riding with the gradients, as they do in
the loop:
- ``dptrain 2 proc x 1 thread``: two worker processes (gloo, loopback), each one CPU device;
- ``dptrain 1 proc x 1 thread`` and ``1 proc x 2 threads``;
- ``DDP 2 proc x 1 thread``: torch.nn.parallel.DistributedDataParallel on the same model;
Per-core scaling efficiency = (2 proc x 1 thread) / (2 x (1 proc x 1 thread)).
Then the bus bandwidth, 2(N-1)/N x bytes / time, of dptrain's bucketed gradient sync of
ResNet-18's gradients against one ``dist.all_reduce`` of a flat buffer of the same size.
Every figure is a median over repetitions after a warm-up; the variants take turns for
``--rounds`` rounds, and dptrain / DDP is the median of the rounds' paired ratios.
``--smoke`` runs a few random batches of lenet-scratch (CI: the script cannot rot).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import dptrain
from common import ModuleEngine, paired, save_result
from dptrain.data import ArrayLoader, load_dataset
from dptrain.distributed.collective import get_collective
from dptrain.parallel.sync.buckets import BucketReducer
from dptrain.models import FunctionalLeNet, GluonLeNet, init_normal, lenet_params, resnet18
from dptrain.run.stopping import StopRequests


def batches(data_dir, model, n, batch_size, rank, world):
    if data_dir is None:                   # the smoke run: random images
        g = torch.Generator().manual_seed(0)
        X, y = torch.rand(n * batch_size, 1, 28, 28, generator=g), torch.randint(0, 10, (n * batch_size,), generator=g)
        loader = ArrayLoader(X, y, batch_size, shuffle=True, seed=0, rank=rank, world_size=world)
        return list(loader), loader.global_num_samples
    data = load_dataset("fashion-mnist", data_dir)
    loader = ArrayLoader(data.train_X, data.train_y, batch_size, shuffle=True, seed=0, max_batches=n,
                         rank=rank, world_size=world)
    return list(loader), loader.global_num_samples


def engine_for(model):
    """The engine the model's recipe trains with (a ``ModelEngine``), on one CPU device."""
    torch.manual_seed(0)
    if model == "lenet-scratch":
        return ModuleEngine(FunctionalLeNet(lenet_params()), [dptrain.cpu(0)], 0.2, channels_last=False,
                            kvstore="naive").engine
    net = GluonLeNet() if model == "gluon-lenet" else resnet18(10, 1)
    return ModuleEngine(net, [dptrain.cpu(0)], 0.1, init=None if model == "gluon-lenet" else init_normal).engine


def ddp_step_fn(model):
    torch.manual_seed(0)
    net = FunctionalLeNet(lenet_params()) if model == "lenet-scratch" else \
        GluonLeNet() if model == "gluon-lenet" else resnet18(10, 1)
    if model == "resnet18":
        init_normal(net)
    if model != "lenet-scratch":
        net = net.to(memory_format=torch.channels_last)
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    def step(X, y):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(X.contiguous(memory_format=torch.channels_last)), y).backward()
        opt.step()
    return step


def timed(step, bs, repeats):
    for X, y in bs[:2]:                      # warm-up
        step(X, y)
    rates = []
    for _ in range(repeats):
        if dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        for X, y in bs:
            step(X, y)
        if dist.is_initialized():
            dist.barrier()
        rates.append(time.perf_counter() - start)
    return statistics.median(rates)


def worker(rank, world, init_file, data_dir, model, kind, n, batch_size, repeats, out):
    torch.set_num_threads(1 if world > 1 or kind == "1x1" else 2)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
    bs, total = batches(data_dir, model, n, batch_size, rank, world)
    if kind == "ddp":
        step = ddp_step_fn(model)
    else:
        engine = engine_for(model)
        runner = dptrain.get_runner(engine.devices)
        stops = StopRequests(get_collective())

        def step(X, y):                               # as the training loop does around every batch
            flags = stops.before_batch()              # None in one process
            with runner.coordinating():
                result = engine.train_batch((X, y), extras=flags)
            stops.after_batch(1, not torch.isfinite(result.loss), result.flags)
    seconds = timed(step, bs, repeats)
    if rank == 0:
        out.put(total / seconds)
    if world > 1:
        dist.destroy_process_group()


def bus_bandwidth(rank, world, init_file, repeats, bucket_mb, out):
    """Time the bucketed sync of ResNet-18's gradients and one flat all_reduce of as many bytes."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    params = [p.detach().requires_grad_() for p in resnet18(10, 1).parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    reducer = BucketReducer([params], get_collective(), bucket_cap_mb=bucket_mb)
    nbytes = sum(p.numel() * 4 for p in params)
    flat = torch.randn(nbytes // 4)

    def bucketed():
        reducer.prepare(denominator=1)
        for j in reversed(range(len(params))):   # the order backward's hooks would arrive in
            with reducer._lock:
                reducer._arrived[j] = 1
                reducer._write(j, arrived=True)
        used, _ = reducer.finish()
        reducer.scatter(0, used, 1.0)

    results = {}
    for name, fn in (("bucketed", bucketed), ("flat", lambda: dist.all_reduce(flat))):
        fn()
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        t = statistics.median(times)
        results[name] = {"seconds": t, "bus_GBps": 2 * (world - 1) / world * nbytes / t / 1e9}
    if rank == 0:
        out.put({"bytes": nbytes, **results})
    dist.destroy_process_group()


def spawn(fn, world, *args):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rdzv")
        procs = [ctx.Process(target=fn, args=(r, world, init, *args, out)) for r in range(world)]
        for p in procs:
            p.start()
        try:
            value = out.get(timeout=900)
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    return value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes over the batches in each run")
    ap.add_argument("--rounds", type=int, default=3, help="the variants take turns this many times")
    ap.add_argument("--lenet-batches", type=int, default=40)
    ap.add_argument("--resnet-batches", type=int, default=24)
    ap.add_argument("--resnet-batch-size", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--only-bandwidth", action="store_true")
    ap.add_argument("--models", nargs="+", default=["lenet-scratch", "gluon-lenet", "resnet18"])
    ap.add_argument("--smoke", action="store_true", help="lenet-scratch on 3 random batches, once (CI)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.smoke:
        args.data_dir, args.models, args.lenet_batches, args.repeats, args.rounds = None, ["lenet-scratch"], 3, 1, 1
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    result = {}
    plans = {"lenet-scratch": (args.lenet_batches, 256), "gluon-lenet": (args.lenet_batches, 256),
             "resnet18": (args.resnet_batches, args.resnet_batch_size)}
    variants = [("dptrain 2 proc x 1 thread", 2, "dptrain"), ("dptrain 1 proc x 1 thread", 1, "1x1"),
                ("dptrain 1 proc x 2 threads", 1, "1x2"), ("DDP 2 proc x 1 thread", 2, "ddp")]
    two, one, ddp = variants[0][0], variants[1][0], variants[3][0]
    for model in ([] if args.only_bandwidth else args.models):
        n, bs = plans[model]
        rates = {label: [] for label, _, _ in variants}
        for r in range(args.rounds):                  # in turns, the order rotated each round
            for label, world, kind in variants[r % 4:] + variants[:r % 4]:
                rates[label].append(spawn(worker, world, args.data_dir, model, kind, n, bs, args.repeats))
                print(f"{model:14s} round {r + 1} {label:28s} {rates[label][-1]:9.1f} img/s", flush=True)
        medians = {label: statistics.median(v) for label, v in rates.items()}
        eff, vs_ddp = paired(rates, two, one) / 2, paired(rates, two, ddp)
        print(f"{model:14s} per-core scaling efficiency {eff:.3f}, dptrain/DDP {vs_ddp:.3f} (paired, median of "
              f"{args.rounds} rounds)", flush=True)
        result[model] = {"images_per_sec": medians, "per_round": rates, "scaling_efficiency": eff,
                         "dptrain_over_ddp": vs_ddp, "batches": n, "batch_size": bs}
    if not args.smoke:
        bw = spawn(bus_bandwidth, 2, 2 * args.repeats + 1, args.bucket_mb)
        bw["ratio"] = bw["bucketed"]["bus_GBps"] / bw["flat"]["bus_GBps"]
        print(f"bus bandwidth: bucketed {bw['bucketed']['bus_GBps']:.2f} GB/s, flat {bw['flat']['bus_GBps']:.2f} GB/s, "
              f"ratio {bw['ratio']:.3f} ({bw['bytes'] / 2**20:.1f} MiB)", flush=True)
        result["bus_bandwidth"] = bw
    save_result(result, "python benchmarks/bench_processes.py " + " ".join(sys.argv[1:]), args.out)


if __name__ == "__main__":
    main()
