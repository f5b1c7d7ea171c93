"""Shared by the benchmark scripts: interleaved repetitions, medians, paired ratios, and the
results file (with the machine, the command and the date beside the numbers)."""
import argparse
import json
import os
import platform
import statistics
import time

import torch

from dptrain.core.atomic import atomic_file


def rounds_parser(doc, samples):
    """The arguments of a benchmark that runs its variants in rounds: ``--rounds``,
    ``--epochs``, ``--samples`` (default ``samples``), ``--smoke`` (one short round, for CI)
    and ``--out`` (the figures as JSON); ``doc``'s first line describes it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=samples)
    parser.add_argument("--smoke", action="store_true", help="one short round (CI)")
    parser.add_argument("--out", default=None, help="write the figures to this JSON file")
    return parser


def save_result(figures, command, path=None):
    """Print ``figures`` and, with ``path``, write them with the machine, ``command`` and the
    date to a JSON file, whole or not at all. Returns the record."""
    record = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
              "command": command, "date": time.strftime("%Y-%m-%d"), **figures}
    print(json.dumps({k: v for k, v in figures.items() if k != "raw"}, indent=1))
    if path:
        with atomic_file(path) as f:
            f.write(json.dumps(record, indent=1).encode())
    return record


def measure(variants, loader, repeats):
    """Run every variant on the same batches, taking turns, ``repeats`` times after a warm-up.

    Returns ``({name: median images/s}, {name: [images/s per repetition]})``. Taking turns
    within each repetition makes slow drifts of a shared machine hit every variant alike;
    the order rotates from one repetition to the next, so no variant always runs right
    after the same other one (whose threads may still be winding down).
    """
    rates = {k: [] for k in variants}
    names = list(variants)
    for rep in range(repeats + 1):            # repetition 0 warms up
        loader.set_epoch(rep)
        batches = list(loader)
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            run = variants[name]
            start = time.perf_counter()
            run(batches)
            if rep:
                rates[name].append(loader.num_samples / (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in rates.items()}, rates


def in_turns(variants, rounds):
    """Run each of ``variants`` (name -> function giving a figure) once a round, in turns, the
    order rotating by one each round (no variant always first, after the machine idled); the
    figures by name, a round each."""
    names = list(variants)
    raw = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            raw[name].append(variants[name]())
    return raw


def paired(raw, a, b):
    """Median over repetitions of rate(a) / rate(b), each pair measured back to back."""
    return statistics.median(x / y for x, y in zip(raw[a], raw[b]))


class ModuleEngine:
    """A module trained through the public engine (replicas + Trainer + kvstore "device", as
    ``dptrain train --recipe lenet-mnist`` runs it), with the ``train_batch(X, y, lr)`` of
    ``ScratchDataParallel`` so the two take the same loop."""

    def __init__(self, net, devices, lr, init=None, channels_last=True, kvstore="device"):
        import torch

        from dptrain import Task
        from dptrain.engine.model_engine import ModelEngine
        empty = (torch.zeros(0, 1, 28, 28), torch.zeros(0, dtype=torch.long))
        self.engine = ModelEngine(Task(net, empty, optimizer="sgd", init=init), devices, kvstore=kvstore,
                                  channels_last=channels_last)
        self.engine.prepare((torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long)), lr)

    @property
    def devices(self):
        return self.engine.devices

    def train_batch(self, X, y, lr=None):
        return self.engine.train_batch((X, y)).loss     # the loss sum, as ScratchDataParallel returns


def launch_two(kind, worker, port):
    """Run a worker script as 2 processes of one CPU thread each, ``kind`` "dptrain" through
    ``dptrain launch``, anything else through ``torchrun`` (on ``port``); returns the last JSON
    line rank 0 printed, with the command's wall seconds as ``wall_s``."""
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kind == "dptrain":
        command = [sys.executable, "-m", "dptrain", "launch", "--processes", "2", *worker]
    else:
        torchrun = Path(sys.executable).with_name("torchrun")
        command = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(port), *worker]
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{out.stderr[-3000:]}")
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    result["wall_s"] = wall
    return result


def alternate(names, repeats, run):
    """``run(name)`` for each of ``names`` in turns (the order reversed every other round),
    ``repeats`` rounds after a warm-up one; ``{name: [its results]}``."""
    raw = {k: [] for k in names}
    for rep in range(repeats + 1):
        for name in (names if rep % 2 == 0 else names[::-1]):
            result = run(name)
            if rep:
                raw[name].append(result)
    return raw


def two_process_parser(doc, batches):
    """The arguments of a benchmark of dptrain against a DDP script on 2 processes:
    ``--batches`` (default ``batches``), ``--repeats``, ``--out``, and ``--worker`` (the
    script run as one of the processes)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--batches", type=int, default=batches)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", choices=["dptrain", "ddp"])
    parser.add_argument("--out", default=None, help="write the figures to this JSON file")
    return parser


def as_worker(args, workers):
    """With ``--worker``: run that worker of ``workers`` ({kind: fn(args) -> dict}) as this
    process, rank 0 printing its result as a JSON line (``launch_two`` reads it); whether it did."""
    if not args.worker:
        return False
    result = workers[args.worker](args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result), flush=True)
    return True
