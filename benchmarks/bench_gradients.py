"""What a callback's ``on_gradients`` costs: a copy of each update's gradients (``run/gradients.py``),
against the plain loop reading ``p.grad`` and against the same run without the callback.

    python benchmarks/bench_gradients.py --rounds 5 --out benchmarks/results/gradients.json
    python benchmarks/bench_gradients.py --smoke

The program, as its users write it: an MLP on flattened 28x28 images (784-512-512-10, 670k
parameters: a copy of its gradients is 2.7 MB), batch 128, SGD with momentum, random data in
memory; the callback takes each update's gradients and keeps each one's norm (the cheapest
thing a gradient histogram does: what is measured is giving them). Variants in turns each
round, the order rotating: the plain loop, the plain loop taking ``{name: p.grad.clone()}``
before each ``optimizer.step()`` (what a histogram callback's loop does), ``fit`` on 1 device
and on 2 virtual CPU devices, each with and without the callback. A figure is the median
epoch past the first of a run, in samples/s; ratios paired in each round.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dptrain  # noqa: E402
from common import in_turns, paired, rounds_parser, save_result  # noqa: E402

BATCH = 128


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def norms(grads):
    return [float(g.norm()) for g in list(grads.values())[:1]]


def plain(data, epochs, read):
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    X, Y = data
    times, seen = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            nn.functional.cross_entropy(model(X[i:i + BATCH]), Y[i:i + BATCH]).backward()
            if read:
                seen.append(norms({n: p.grad.clone() for n, p in model.named_parameters()}))
            opt.step()
        times.append(time.perf_counter() - start)
    return len(X) / statistics.median(times[1:])


class Norms(dptrain.Callback):
    def __init__(self):
        self.seen = []

    def on_gradients(self, run, batch, grads):
        self.seen.append(norms(grads))


def fitted(data, epochs, devices, read):
    callbacks = [Norms()] if read else []
    result = dptrain.fit(net(), data, optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                         epochs=epochs, batch_size=BATCH, devices=devices, shuffle=False, log=None, progress=False,
                         callbacks=callbacks)
    if read and len(callbacks[0].seen) != epochs * (len(data[0]) // BATCH):
        raise RuntimeError(f"on_gradients was told {len(callbacks[0].seen)} updates")
    return len(data[0]) / statistics.median(h["sec"] for h in result["history"][1:])


def main() -> None:
    args = rounds_parser(__doc__, 8192).parse_args()
    rounds, epochs, samples = (1, 2, 512) if args.smoke else (args.rounds, args.epochs, args.samples)
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))
    variants = {"plain": lambda: plain(data, epochs, False), "plain, p.grad copied": lambda: plain(data, epochs, True)}
    for devices in (1, 2):
        variants[f"fit, {devices} device(s)"] = lambda d=devices: fitted(data, epochs, d, False)
        variants[f"fit, {devices} device(s), on_gradients"] = lambda d=devices: fitted(data, epochs, d, True)
    raw = in_turns(variants, rounds)
    figures = {"samples_per_s": {k: statistics.median(v) for k, v in raw.items()},
               "plain, p.grad copied / plain": paired(raw, "plain, p.grad copied", "plain"),
               **{f"fit, {d} device(s): on_gradients / without": paired(raw, f"fit, {d} device(s), on_gradients",
                                                                        f"fit, {d} device(s)") for d in (1, 2)},
               "fit, 1 device, on_gradients / plain, p.grad copied": paired(raw, "fit, 1 device(s), on_gradients",
                                                                            "plain, p.grad copied"),
               "raw": raw}
    command = "python benchmarks/bench_gradients.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "epochs": epochs, "samples": samples, **figures}, command, args.out)


if __name__ == "__main__":
    main()
