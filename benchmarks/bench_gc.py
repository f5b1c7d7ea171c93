"""Python's garbage collections while training: the plain loop against ``dptrain.fit`` (1
device), on tensors in memory and on a stream of single samples, counted by generation over
the training steps alone (``fit``'s set-up counted apart), with the milliseconds the full
collections took; and what the first ``torch.optim`` optimizer of a process costs (torch
imports ``torch._dynamo`` then, for the plain loop as for ``fit``), in a fresh process.

A full collection with torch loaded takes tens of ms (``full_collection_ms``): a step path
that left garbage cycles, or kept objects alive long enough to age them, would pay that every
few hundred steps. Variants in turns, ``--rounds`` times; the counts are the same each round.

    python benchmarks/bench_gc.py --rounds 3 --epochs 3
    python benchmarks/bench_gc.py --smoke          # CI: one short round
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dptrain  # noqa: E402
from common import rounds_parser, save_result  # noqa: E402

BATCH = 128


class Collections:
    """Each collection's generation and milliseconds, from ``start()`` on."""

    def __init__(self) -> None:
        self.seen: List[tuple] = []
        self._began = 0.0
        self.on = False
        gc.callbacks.append(self._hear)

    def _hear(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self.on:
            self.seen.append((info["generation"], 1000 * (time.perf_counter() - self._began)))

    def start(self) -> None:
        self.seen, self.on = [], True

    def counts(self) -> Dict[str, Any]:
        self.on = False
        counts = {f"gen{n}": sum(g == n for g, _ in self.seen) for n in range(3)}
        return {**counts, "gen2_ms": round(sum(ms for g, ms in self.seen if g == 2), 1)}


class Samples(torch.utils.data.IterableDataset):
    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y = X, y

    def __len__(self) -> int:
        return len(self.X)

    def __iter__(self):
        for i in range(len(self.X)):
            yield self.X[i], self.y[i]


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def plain(data: Any, epochs: int, gcs: Collections) -> Dict[str, Any]:
    net = model()
    opt, loss_fn = torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=not isinstance(data, Samples))
    gcs.start()
    for _ in range(epochs):
        for xb, yb in loader:
            loss = loss_fn(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"steps": gcs.counts()}


def ours(data: Any, epochs: int, gcs: Collections) -> Dict[str, Any]:
    setup: Dict[str, Any] = {}

    class Steps(dptrain.Callback):          # the set-up's collections apart from the steps'
        def on_fit_start(self, run: Any) -> None:
            setup.update(gcs.counts())
            gcs.start()

    gcs.start()
    dptrain.fit(model(), data, epochs=epochs, batch_size=BATCH, devices=1, lr=0.1, log=None, progress=False,
                callbacks=[Steps()])
    return {"steps": gcs.counts(), "setup": setup}


def first_optimizer_ms() -> float:
    """The first optimizer of a fresh process (torch imported already), in ms."""
    code = ("import time, torch; p = [torch.zeros(1, requires_grad=True)]; t = time.perf_counter(); "
            "torch.optim.SGD(p, lr=0.1); print(1000 * (time.perf_counter() - t))")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    args = rounds_parser(__doc__, samples=BATCH * 400).parse_args()
    if args.smoke:
        args.rounds, args.epochs, args.samples = 1, 1, BATCH * 20
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(args.samples, 32, generator=g), torch.randint(0, 4, (args.samples,), generator=g)
    programs = {"tensors": (X, y), "stream of samples": Samples(X, y)}
    plain_data = {"tensors": torch.utils.data.TensorDataset(X, y), "stream of samples": Samples(X, y)}
    torch.optim.SGD([torch.zeros(1, requires_grad=True)])       # (torch's lazy imports, before any count)
    gcs = Collections()
    raw: Dict[str, List[Dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for name in programs:
            raw.setdefault(f"{name}: plain loop", []).append(plain(plain_data[name], args.epochs, gcs))
            raw.setdefault(f"{name}: dptrain", []).append(ours(programs[name], args.epochs, gcs))
    began = time.perf_counter()
    gc.collect()
    figures = {"steps": args.epochs * (args.samples // BATCH), "rounds": {k: v for k, v in raw.items()},
               "full_collection_ms": round(1000 * (time.perf_counter() - began), 1),
               "first_optimizer_ms": round(first_optimizer_ms(), 1)}
    save_result(figures, " ".join(["python", "benchmarks/bench_gc.py", *sys.argv[1:]]), args.out)


if __name__ == "__main__":
    main()
