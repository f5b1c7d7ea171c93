"""What forward hooks of the user's cost on several devices of a process: their forwards in turn
(``engine/forward_hooks.py``), against the plain loop and one device.

    python benchmarks/bench_forward_hooks.py --rounds 5 --out benchmarks/results/forward_hooks.json
    python benchmarks/bench_forward_hooks.py --smoke

The program, as its users write it: a CNN (two 5x5 convolutions of 16 and 32 channels with
pooling, then 128 and 10 units) with an auxiliary head on its first block's pooled output, which a
forward hook keeps for the step's second loss (deep supervision, a feature distillation's shape);
random 28x28 images, batch 256, SGD. Variants in turns each round, the order rotating: the plain
loop, ``fit`` on 1 device, on 2 virtual CPU devices (the forwards in turn), ``devices="auto"``
(which measures both), and the model without its hook on 2 devices (the forwards at once, the
auxiliary loss left out: what the turns cost, beside). A figure is the median epoch past the first
of a run, in samples/s; ratios paired in each round.
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

BATCH = 256


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))
        self.rest = nn.Sequential(nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                  nn.Linear(32 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10))
        self.aux = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(16 * 16, 10))

    def forward(self, x):
        return self.rest(self.block(x))


def hooked(hook=True):
    """The model, and its step: the cross-entropy plus the auxiliary head's on the kept features."""
    net, kept = Net(), {}
    if hook:
        net.block.register_forward_hook(lambda module, inputs, output: kept.__setitem__("block", output))

    def step(model, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(model(x), y)
        return loss + 0.3 * nn.functional.cross_entropy(model.aux(kept["block"]), y) if hook else loss
    return net, step


def plain(data, epochs):
    net, step = hooked()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    X, Y = data
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            step(net, (X[i:i + BATCH], Y[i:i + BATCH])).backward()
            opt.step()
        times.append(time.perf_counter() - start)
    return len(X) / statistics.median(times[1:])


def fitted(data, epochs, devices, hook=True):
    net, step = hooked(hook)
    result = dptrain.fit(net, data, step=step, optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                         epochs=epochs, batch_size=BATCH, devices=devices, shuffle=False, log=None, progress=False)
    return len(data[0]) / statistics.median(h["sec"] for h in result["history"][1:]), result["devices"]


def main() -> None:
    args = rounds_parser(__doc__, 8192).parse_args()
    rounds, epochs, samples = (1, 2, 1024) if args.smoke else (args.rounds, args.epochs, args.samples)
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))
    chosen = []

    def auto():
        rate, devices = fitted(data, epochs, "auto")
        chosen.append(len(devices))
        return rate
    variants = {"plain": lambda: plain(data, epochs), "fit, 1 device": lambda: fitted(data, epochs, 1)[0],
                "fit, 2 devices (in turn)": lambda: fitted(data, epochs, 2)[0], "fit, auto": auto,
                "fit, 2 devices, no hook (at once)": lambda: fitted(data, epochs, 2, hook=False)[0]}
    names = list(variants)
    raw = in_turns(variants, rounds)
    figures = {"samples_per_s": {k: statistics.median(v) for k, v in raw.items()},
               **{f"{k} / plain": paired(raw, k, "plain") for k in names[1:]},
               "in turn / at once (no hook)": paired(raw, "fit, 2 devices (in turn)",
                                                     "fit, 2 devices, no hook (at once)"),
               "auto chose (devices, each round)": chosen, "raw": raw}
    command = "python benchmarks/bench_forward_hooks.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "epochs": epochs, "samples": samples, **figures}, command, args.out)


if __name__ == "__main__":
    main()
