"""What float16's loss scaling costs: ``fit(amp="fp16")`` against the plain loop of torch's
AMP recipe (autocast in float16 and a ``torch.amp.GradScaler``), and against dptrain in
bfloat16 (no scaling), on one device; epochs in turns, medians of epoch times past the first,
paired ratios.

    python benchmarks/bench_fp16.py --rounds 7 --epochs 4 --samples 16384
    python benchmarks/bench_fp16.py --smoke        # CI: one short round

On a CPU, torch's float16 convolutions are slow for everyone (the CNN: 6.5 s an epoch of 1,024
samples in float16, plain loop and dptrain alike, against 0.08 s in bfloat16): ``--models cnn``
measures that more than the scaling; the default is the MLP. On a GPU both are worth running
(the GPU suite does: ``--device cuda:0 --models mlp,cnn``).
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from common import rounds_parser, save_result

BATCH = 128


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10))


MODELS: Dict[str, Callable[[], nn.Module]] = {"mlp": mlp, "cnn": cnn}


def data(name: str, samples: int):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(samples, 32, generator=g) if name == "mlp" else torch.randn(samples, 1, 28, 28, generator=g)
    return X, torch.randint(0, 4 if name == "mlp" else 10, (samples,), generator=g)


class Epochs(dptrain.Callback):
    def __init__(self):
        self.seconds: List[float] = []

    def on_epoch_start(self, run, epoch):
        self.start = time.perf_counter()

    def on_epoch_end(self, run, epoch, row):
        self.seconds.append(time.perf_counter() - self.start)


def dptrain_epochs(name: str, amp: str, X, y, epochs: int, device: torch.device) -> List[float]:
    torch.manual_seed(0)
    timer = Epochs()
    dptrain.fit(MODELS[name](), (X, y), loss=nn.CrossEntropyLoss(), optimizer="sgd", lr=0.05, amp=amp, epochs=epochs,
                batch_size=BATCH, devices=1 if device.type == "cpu" else str(device), callbacks=[timer], log=None)
    return timer.seconds


def plain_epochs(name: str, X, y, epochs: int, device: torch.device) -> List[float]:
    torch.manual_seed(0)
    net = MODELS[name]().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device.type)
    seconds = []
    for epoch in range(epochs):
        start, order = time.perf_counter(), torch.randperm(len(X))
        for i in range(0, len(X), BATCH):
            idx = order[i:i + BATCH]
            opt.zero_grad()
            with torch.autocast(device.type, dtype=torch.float16):
                loss = F.cross_entropy(net(X[idx].to(device, non_blocking=True)), y[idx].to(device, non_blocking=True))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> int:
    ap = rounds_parser(__doc__, samples=8192)
    ap.add_argument("--models", default="mlp")
    ap.add_argument("--device", default="cpu", help="cpu, or a GPU such as cuda:0 (the GPU suite's)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.epochs, args.samples, args.models = 1, 2, 512, "mlp"
    figures: Dict[str, Dict] = {}
    for name in args.models.split(","):
        X, y = data(name, args.samples)
        device = torch.device(args.device)
        variants = {"plain loop, GradScaler": lambda: plain_epochs(name, X, y, args.epochs, device),
                    "dptrain fp16": lambda: dptrain_epochs(name, "fp16", X, y, args.epochs, device),
                    "dptrain bf16": lambda: dptrain_epochs(name, "bf16", X, y, args.epochs, device)}
        runs: Dict[str, List[float]] = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                runs[v].append(statistics.median(variants[v]()[1:]))       # past the first epoch
        plain = runs["plain loop, GradScaler"]
        figures[name] = {"epoch_sec": {v: statistics.median(s) for v, s in runs.items()},
                         "dptrain fp16 / plain loop (speed)": statistics.median(
                             p / d for p, d in zip(plain, runs["dptrain fp16"])),
                         "dptrain fp16 / dptrain bf16 (speed)": statistics.median(
                             b / d for b, d in zip(runs["dptrain bf16"], runs["dptrain fp16"])),
                         "raw": runs}
    save_result(figures, "python benchmarks/bench_fp16.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
