"""A function of the whole evaluation set (a Hugging Face ``compute_metrics``) in
``dptrain.evaluate``, against the loop a Trainer runs for it: a DataLoader over the set, every
batch's logits and labels kept, then ``compute_metrics((logits, labels))`` on NumPy arrays,
beside the loss; and against the same ``dptrain.evaluate`` call without it (what keeping the
outputs and calling the function cost). Whole calls, set-up included, in rounds (the order
rotated every round) after a warm-up round; medians of the ratios to dptrain's call with it.

    python benchmarks/bench_whole_set.py --rounds 21 --out benchmarks/results/whole_set.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import everyday  # noqa: E402
from common import save_result  # noqa: E402


def compute_metrics(eval_pred):
    """A Trainer program's: accuracy and macro-F1 from the logits, in NumPy."""
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    f1 = []
    for c in np.unique(labels):
        tp = np.sum((predictions == c) & (labels == c))
        f1.append(2 * tp / (np.sum(predictions == c) + np.sum(labels == c)))
    return {"accuracy": float(np.mean(predictions == labels)), "f1": float(np.mean(f1))}


def _inputs(batch):
    if isinstance(batch, dict):
        return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]
    return batch[0], batch[1]


def plain_call(program, model, data):
    """The Trainer's evaluation loop, written plainly: logits and labels kept, then the function."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data) if isinstance(data, tuple) else data,
                                         batch_size=program.batch, collate_fn=program.collate)
    model.eval()
    logits, labels, loss = [], [], torch.zeros(())
    with torch.no_grad():
        for batch in loader:
            x, y = _inputs(batch)
            out = model(**x) if isinstance(x, dict) else model(x)
            loss += F.cross_entropy(out, y, reduction="sum")
            logits.append(out)
            labels.append(y)
    model.train()
    figures = compute_metrics((torch.cat(logits).numpy(), torch.cat(labels).numpy()))
    return {"loss": float(loss) / sum(len(y) for y in labels), **figures}


def dptrain_call(program, model, data, metrics):
    import dptrain
    return dptrain.evaluate(model, data, batch_size=program.batch, collate_fn=program.collate, devices=1,
                            metrics=dptrain.whole_set(compute_metrics) if metrics else None)


CALLS = {"plain": lambda p, m, d: plain_call(p, m, d), "dptrain": lambda p, m, d: dptrain_call(p, m, d, True),
         "no metric": lambda p, m, d: dptrain_call(p, m, d, False)}


def rounds_of(program, rounds: int):
    """``rounds`` timed rounds of the three calls after a warm-up round, the order rotated every
    round; medians of the ratios to ``dptrain`` (plain / dptrain: its speed against the Trainer's
    loop; no metric / dptrain: 1 minus what keeping the outputs and calling the function cost)."""
    torch.manual_seed(0)
    model, data = program.model(), everyday.held_out(program)
    plain, mine = plain_call(program, model, data), dptrain_call(program, model, data, True)
    assert abs(plain["f1"] - mine["test_f1"]) < 1e-9 and abs(plain["accuracy"] - mine["test_accuracy"]) < 1e-9
    names = list(CALLS)
    seconds = {name: [] for name in names}
    for k in range(rounds + 1):
        for name in names[k % 3:] + names[:k % 3]:
            start = time.perf_counter()
            CALLS[name](program, model, data)
            if k:
                seconds[name].append(time.perf_counter() - start)
    ratio = {other: statistics.median(a / b for a, b in zip(seconds[other], seconds["dptrain"]))
             for other in ("plain", "no metric")}
    return {"plain / dptrain": ratio["plain"], "no metric / dptrain": ratio["no metric"],
            **{f"{name}_ms": statistics.median(s) * 1e3 for name, s in seconds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="tiny-mlp,text")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    figures = {}
    for name in args.programs.split(","):
        got = figures[name] = rounds_of(everyday.PROGRAMS[name], args.rounds)
        print(f"{name:10s} plain {got['plain_ms']:6.1f} ms, dptrain with it {got['dptrain_ms']:6.1f} ms, without "
              f"{got['no metric_ms']:6.1f} ms; plain / dptrain {got['plain / dptrain']:.3f}, "
              f"without / with {got['no metric / dptrain']:.3f}", flush=True)
    save_result({"rounds": args.rounds, "programs": figures}, " ".join(sys.argv), args.out)


if __name__ == "__main__":
    main()
