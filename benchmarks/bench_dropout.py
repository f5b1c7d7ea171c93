"""What exact random draws cost: a model with dropout on 2 virtual CPU devices.

Several CPU devices of a process share one CPU generator. dptrain gives each device's
dropout layers a stream of their own (``engine/device_streams.py``), and runs the forward
passes in turn only for draws outside such layers (``engine/step_plan.Turns``): the same
masks in every run, and exact resume. This measures the default (own streams) against the
forwards in turn (what draws outside the layers get), the shared generator as before (the
threads take its numbers in any order: not reproducible), and one device, in turns, median
epoch times past the first, paired ratios.

    python benchmarks/bench_dropout.py --rounds 5 --epochs 3
    python benchmarks/bench_dropout.py --smoke        # CI: one short round
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch
from torch import nn

import dptrain
from dptrain.engine import device_streams
from dptrain.engine.device_streams import DeviceStreams, RandomDraws
from common import rounds_parser, save_result


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
                         nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.25),
                         nn.Linear(32 * 5 * 5, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 512),
                         nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 10))


MODELS: Dict[str, Callable[[], nn.Module]] = {"cnn-dropout": cnn, "mlp-dropout": mlp}


class NoStreams(DeviceStreams):
    """Streams for no replica: the random layers draw from the shared generator."""

    def __init__(self, replicas: Any, seed: int, rank: int, devices: Any = ()):
        super().__init__([], seed, rank, devices)


def epoch_seconds(make: Callable[[], nn.Module], devices: int, how: str, epochs: int, samples: int) -> float:
    """Median epoch time past the first of one ``fit``; ``how``: "streams" (the default),
    "turns" (no streams: the forwards in turn), "shared" (neither: as before)."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g)
    streams, decide = device_streams.DeviceStreams, RandomDraws.decide
    if how in ("turns", "shared"):
        device_streams.DeviceStreams = NoStreams     # type: ignore[misc]
    if how == "shared":
        RandomDraws.decide = lambda self, drew: setattr(self, "draws", False)   # type: ignore[method-assign]
    try:
        torch.manual_seed(0)
        result = dptrain.fit(make(), (X, y), epochs=epochs, batch_size=256, devices=devices, log=None,
                             optimizer=torch.optim.SGD, lr=0.05)
    finally:
        device_streams.DeviceStreams, RandomDraws.decide = streams, decide     # type: ignore[misc,method-assign]
    return statistics.median(h["sec"] for h in result["history"][1:])


def main(argv: Any = None) -> None:
    parser = rounds_parser(__doc__, samples=10240)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.epochs, args.samples = 1, 2, 1024
    variants = {"1 device": (1, "streams"), "2 devices": (2, "streams"), "2 devices, forwards in turn": (2, "turns"),
                "2 devices, shared generator (before)": (2, "shared")}
    command = " ".join(["python benchmarks/bench_dropout.py"] + (argv if argv is not None else sys.argv[1:]))
    out: Dict[str, Any] = {"models": {}}
    for name, make in MODELS.items():
        times: Dict[str, List[float]] = {v: [] for v in variants}
        start = time.perf_counter()
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for v in order:
                times[v].append(epoch_seconds(make, *variants[v], args.epochs, args.samples))
        def ratio(a: str, b: str) -> float:       # b's speed over a's: a's time over b's, paired
            return statistics.median(x / y for x, y in zip(times[a], times[b]))
        out["models"][name] = {"epoch_sec": {v: statistics.median(t) for v, t in times.items()},
                               "2 devices / shared generator": ratio("2 devices, shared generator (before)",
                                                                     "2 devices"),
                               "forwards in turn / shared generator": ratio("2 devices, shared generator (before)",
                                                                            "2 devices, forwards in turn"),
                               "2 devices / 1 device": ratio("1 device", "2 devices"),
                               "bench_sec": time.perf_counter() - start}
        print(name, json.dumps(out["models"][name], indent=1), flush=True)
    save_result(out, command, args.out)        # with the machine and the date, whole or not at all


if __name__ == "__main__":
    main()
