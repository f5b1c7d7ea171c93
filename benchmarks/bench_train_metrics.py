"""What ``train_metrics=True`` costs: ``dptrain.fit`` with and without it (train_acc on the
training batches), and the plain loop that counts its training accuracy as its users write it
(``correct += (output.argmax(1) == y).sum()``, read once an epoch) against the plain loop
without, on the everyday classification programs of ``everyday.py``, one device.

Each round runs the four variants one after another (the order turned every round), each a
fresh run of ``--epochs`` epochs; a variant's figure is its median epoch past the first. The
ratios are paired per round (without / with: below 1 is slower), medians over the rounds.

    python benchmarks/bench_train_metrics.py --data-dir ../shared/datasets --rounds 5 \
        --out benchmarks/results/train_metrics.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import everyday  # noqa: E402
from common import save_result  # noqa: E402

PROGRAMS = ("tiny-mlp", "text", "cnn-augment", "lenet")


def plain(program, epochs: int, accuracy: bool) -> List[float]:
    """The plain loop; with ``accuracy``, its training accuracy counted on the device and
    read once an epoch."""
    dev, model, opt, loader = everyday._plain(program, "cpu")
    times = []
    for _ in range(epochs):
        start = time.perf_counter()
        correct = torch.zeros((), dtype=torch.long)
        for batch in loader:
            batch = everyday._to(batch, dev)
            if isinstance(batch, dict):
                y = batch["labels"]
                out = model(**{k: v for k, v in batch.items() if k != "labels"})
            else:
                x, y = batch
                out = model(x)
            opt.zero_grad()
            F.cross_entropy(out, y).backward()
            opt.step()
            if accuracy:
                correct += (out.argmax(1) == y).sum()
        if accuracy:
            correct.item()
        times.append(time.perf_counter() - start)
    return times


def fitted(program, epochs: int, train_metrics: bool) -> List[float]:
    import dptrain
    torch.manual_seed(0)
    result = dptrain.fit(program.model(), program.data(), train_metrics=train_metrics,
                         **everyday.fit_settings(program, epochs, "cpu:0"))
    if train_metrics:
        assert "train_acc" in result["history"][-1]
    return [row["sec"] for row in result["history"]]


VARIANTS = {"plain loop": lambda p, e: plain(p, e, False), "plain loop + accuracy": lambda p, e: plain(p, e, True),
            "dptrain": lambda p, e: fitted(p, e, False), "dptrain, train_metrics": lambda p, e: fitted(p, e, True)}


def measure(program, rounds: int, epochs: int) -> Dict[str, object]:
    names = list(VARIANTS)
    seconds: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds[name].append(statistics.median(VARIANTS[name](program, epochs)[1:]))
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(seconds[a], seconds[b]))  # noqa: E731
    return {"epoch_sec": {n: statistics.median(v) for n, v in seconds.items()}, "raw": seconds,
            "dptrain with / without train_metrics": ratio("dptrain", "dptrain, train_metrics"),
            "plain with / without accuracy": ratio("plain loop", "plain loop + accuracy"),
            "train_metrics vs plain + accuracy": ratio("plain loop + accuracy", "dptrain, train_metrics")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="Fashion-MNIST's folder (lenet, cnn-augment)")
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=0, help="the first N samples of each program only")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.data_dir:
        os.environ["BENCH_DATA"] = args.data_dir
    figures = {}
    for name in args.programs.split(","):
        program = everyday.PROGRAMS[name] if not args.samples else everyday.shrink(everyday.PROGRAMS[name],
                                                                                   args.samples)
        figures[name] = measure(program, args.rounds, args.epochs)
        f = figures[name]
        print(f"{name}: epoch {', '.join(f'{n} {s:.3f} s' for n, s in f['epoch_sec'].items())}; dptrain "
              f"without/with train_metrics {f['dptrain with / without train_metrics']:.3f}x, plain without/with "
              f"accuracy {f['plain with / without accuracy']:.3f}x, plain+acc / train_metrics "
              f"{f['train_metrics vs plain + accuracy']:.3f}x", flush=True)
    save_result(figures, " ".join(sys.argv), args.out)


if __name__ == "__main__":
    main()
