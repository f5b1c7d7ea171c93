"""What reading a Dataset under per-sample seeds costs, by the generator it draws from.

dptrain reads every sample of a ``Dataset`` that draws random numbers with the generators it
draws from seeded by ``(seed, epoch, position)`` (``data/seeded_reads.py``), so augmentation
is the same whatever the processes. This reads 64-sample parts of a small augmenting dataset
(a random shift and flip of 28x28 images, drawn from torch's, NumPy's or Python's
generator) through ``_Seeded``, past its watch, against the same reads unseeded (a plain
``[dataset[i] for i in part]``), in turns, medians of paired ratios.

    python benchmarks/bench_seeded_reads.py --rounds 7 --out benchmarks/results/seeded_reads.json

The watch itself (a fresh loader's first ``WATCH`` parts, where it learns which generators
the Dataset draws from), for a quiet Dataset and drawing ones: a fresh watch, the one-part
watch of a Dataset a loader of this process watched before, and the unseeded reads:

    python benchmarks/bench_seeded_reads.py --watch --rounds 21 --out benchmarks/results/seeded_watch.json
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from dptrain.data.seeded_reads import _Part, _Seeded
from common import save_result


class Augmenting(Dataset):
    """64 images, each read shifted by 0-4 pixels and flipped half the time."""

    def __init__(self, generator: str):
        self.generator, self.images = generator, torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.generator is None:          # a quiet Dataset: no draw
            return self.images[i]
        draw = {"torch": lambda: (int(torch.randint(0, 5, ())), float(torch.rand(()))),
                "numpy": lambda: (int(np.random.randint(0, 5)), float(np.random.rand())),
                "random": lambda: (random.randint(0, 4), random.random())}[self.generator]
        shift, flip = draw()
        x = torch.roll(self.images[i], shift, -1)
        return x.flip(-1) if flip < 0.5 else x


def parts(n: int):
    for b in range(n):
        part = _Part(range(64))
        part.seed = (0, 1, b * 64)
        yield part


def read_seconds(generator: str, seeded: bool, n: int) -> float:
    dataset = Augmenting(generator)
    reader = _Seeded(dataset)
    for part in parts(_Seeded.WATCH + 2):       # past the watch
        reader.__getitems__(part)
    start = time.perf_counter()
    for part in parts(n):
        if seeded:
            reader.__getitems__(part)
        else:
            [dataset[i] for i in part]
    return time.perf_counter() - start


def watch_seconds(generator: Optional[str], how: str) -> float:
    """``WATCH`` parts read by a fresh watch (``how="fresh"``), by the one-part watch of a
    Dataset watched before (``"kept"``), or unseeded (``"unseeded"``)."""
    dataset = Augmenting(generator)
    if how == "kept":
        first = _Seeded(dataset)
        for part in parts(_Seeded.WATCH):
            first.__getitems__(part)
    reader = _Seeded(dataset)
    start = time.perf_counter()
    for part in parts(_Seeded.WATCH):
        reader.__getitems__(part) if how != "unseeded" else [dataset[i] for i in part]
    return time.perf_counter() - start


def watch_figures(rounds: int) -> dict:
    figures = {}
    for generator in (None, "torch", "numpy", "random"):
        times = {how: [] for how in ("fresh", "kept", "unseeded")}
        for r in range(rounds):
            for how in (list(times) if r % 2 else list(times)[::-1]):
                times[how].append(watch_seconds(generator, how))
        per_part = 1e6 / _Seeded.WATCH
        figures[generator or "quiet"] = {
            f"{how}_us_per_part": round(statistics.median(t) * per_part, 1) for how, t in times.items()}
        figures[generator or "quiet"].update({
            f"{how}_watch_us_per_part": round(statistics.median(a - b for a, b in zip(t, times["unseeded"])) * per_part, 1)
            for how, t in times.items() if how != "unseeded"})
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parts", type=int, default=200)
    ap.add_argument("--watch", action="store_true", help="time the watch of a fresh loader's first parts instead")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.watch:
        save_result({"figures": watch_figures(args.rounds)},
                    f"python benchmarks/bench_seeded_reads.py --watch --rounds {args.rounds}", args.out)
        return
    figures = {}
    for generator in ("torch", "numpy", "random"):
        plain, seeded = [], []
        for r in range(args.rounds):
            for name in (("plain", "seeded") if r % 2 else ("seeded", "plain")):
                (plain if name == "plain" else seeded).append(read_seconds(generator, name == "seeded", args.parts))
        per_sample = 1e6 / (args.parts * 64)
        figures[generator] = {"us_per_sample_unseeded": round(statistics.median(plain) * per_sample, 2),
                              "us_per_sample_seeded": round(statistics.median(seeded) * per_sample, 2),
                              "seeded_over_unseeded": round(statistics.median(s / p for s, p in zip(seeded, plain)), 3)}
    save_result({"figures": figures}, f"python benchmarks/bench_seeded_reads.py --rounds {args.rounds} "
                f"--parts {args.parts}", args.out)


if __name__ == "__main__":
    main()
