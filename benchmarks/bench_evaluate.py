"""``dptrain.evaluate`` against the plain loop's evaluation of the same model and held-out set
(the everyday programs of ``everyday.py``), whole calls: the plain loop's user builds a
DataLoader and loops (loss summed, correct predictions counted, read once); dptrain's calls
``dptrain.evaluate(model, data, ...)``, set-up included. In turns, the order swapped every
pair; medians of the paired ratios (plain seconds / dptrain seconds: above 1 is faster).

    python benchmarks/bench_evaluate.py --data-dir ../shared/datasets --pairs 21 \
        --out benchmarks/results/evaluate.json
    python benchmarks/bench_evaluate.py --programs lenet,cnn-augment --devices 1 --batch-sizes 64,256,1000 \
        --pairs 11 --out benchmarks/results/evaluate_batches.json      # fit's eval_batch_size, both sides
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import everyday  # noqa: E402
from common import save_result  # noqa: E402


def plain_call(program, model, data, batch) -> float:
    """What a user of the plain loop writes: a DataLoader over the set, then the loop."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data) if isinstance(data, tuple) else data,
                                         batch_size=batch, collate_fn=program.collate,
                                         num_workers=program.workers)
    return everyday._evaluate(program, model, loader, torch.device("cpu"))


def dptrain_call(program, model, data, devices, batch):
    import dptrain
    return dptrain.evaluate(model, data, batch_size=batch, collate_fn=program.collate,
                            num_workers=program.workers, step=program.step, devices=devices)


def pairs_of(program, devices, pairs: int, batch: int):
    """``pairs`` timed pairs after one warm-up pair, both reading by ``batch``; the order swaps every pair."""
    torch.manual_seed(0)
    model, data = program.model(), everyday.held_out(program)
    ratios, plain, mine = [], [], []
    for k in range(pairs + 1):
        times = {}
        for who in (("plain", "dptrain") if k % 2 else ("dptrain", "plain")):
            start = time.perf_counter()
            plain_call(program, model, data, batch) if who == "plain" else \
                dptrain_call(program, model, data, devices, batch)
            times[who] = time.perf_counter() - start
        if k:
            ratios.append(times["plain"] / times["dptrain"])
            plain.append(times["plain"])
            mine.append(times["dptrain"])
    return {"ratio": statistics.median(ratios), "plain_s": statistics.median(plain),
            "dptrain_s": statistics.median(mine), "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="tiny-mlp,text,hf-style,cnn-augment")
    parser.add_argument("--devices", default="1,auto", help="dptrain's devices= values to measure")
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--batch-sizes", default=None,
                        help="evaluation batch sizes to measure, comma-separated (default: each program's own)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.data_dir:
        os.environ["BENCH_DATA"] = args.data_dir
    torch.set_num_threads(os.cpu_count() or 1)
    figures = {}
    for name in args.programs.split(","):
        program = everyday.PROGRAMS[name]
        for devices in args.devices.split(","):
            for batch in ([int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else [program.batch]):
                got = pairs_of(program, int(devices) if devices.isdigit() else devices, args.pairs, batch)
                key = f"{name}, devices={devices}" + (f", batch={batch}" if args.batch_sizes else "")
                figures[key] = got
                print(f"{name:12s} devices={devices:5s} batch {batch:5d} plain {got['plain_s'] * 1e3:8.1f} ms  "
                      f"dptrain {got['dptrain_s'] * 1e3:8.1f} ms  ratio {got['ratio']:.3f}", flush=True)
    save_result({"pairs": args.pairs, "programs": figures}, " ".join(sys.argv), args.out)


if __name__ == "__main__":
    main()
