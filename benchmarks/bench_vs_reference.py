"""dptrain against the reference system (MXNet 1.9.1), side by side, several seeds, one script.

    python3 -m venv /tmp/mxvenv && /tmp/mxvenv/bin/pip install numpy==1.23.5 mxnet==1.9.1
    python benchmarks/bench_vs_reference.py --data-dir ../shared/datasets \\
        --mxnet-python /tmp/mxvenv/bin/python --seeds 0 1 2 --out benchmarks/results/vs_reference.json

For every seed the two systems take turns (reference first, then dptrain), each a fresh
process running the full ``lenet-scratch`` recipe (batch 256, lr 0.2, 10 epochs) on two CPU
devices/contexts. Reported: test accuracy after the last epoch for every run (the recipe's
outcome is a distribution over seeds, so both are given per seed), seconds per epoch
(training loop only, as the reference measures it) and the paired speed-up per seed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def reference(args, seed):
    env = dict(os.environ)
    if args.mxnet_omp_threads:
        env["OMP_NUM_THREADS"] = str(args.mxnet_omp_threads)
    return run_json([args.mxnet_python, os.path.join(HERE, "reference_mxnet.py"), "--data-dir", args.data_dir,
                     "--contexts", str(args.devices), "--epochs", str(args.epochs), "--seed", str(seed)], env)


def dptrain(args, seed):
    return run_json([sys.executable, "-m", "dptrain", "train", "--json", "--recipe", "lenet-scratch",
                     "--devices", str(args.devices), "--epochs", str(args.epochs), "--seed", str(seed),
                     "--data-dir", args.data_dir])


def summary(runs):
    accs = [r["test_acc"] for r in runs]
    return {"test_acc": accs, "test_acc_mean": statistics.mean(accs),
            "sec_per_epoch": [r["sec_per_epoch"] for r in runs],
            "sec_per_epoch_median": statistics.median(r["sec_per_epoch"] for r in runs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--mxnet-python", required=True, help="python of an environment with mxnet==1.9.1")
    ap.add_argument("--mxnet-omp-threads", type=int, default=2,
                    help="OMP_NUM_THREADS for MXNet (2: its fastest setting here; 0: MXNet's default)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    runs = {"reference": [], "dptrain": []}
    for seed in args.seeds:
        runs["reference"].append(reference(args, seed))
        runs["dptrain"].append(dptrain(args, seed))
        print(f"seed {seed}: reference acc {runs['reference'][-1]['test_acc']:.4f} "
              f"{runs['reference'][-1]['sec_per_epoch']:.1f} s/epoch; dptrain acc "
              f"{runs['dptrain'][-1]['test_acc']:.4f} {runs['dptrain'][-1]['sec_per_epoch']:.1f} s/epoch",
              flush=True)
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "command": " ".join(sys.argv), "summary": {k: summary(v) for k, v in runs.items()},
              "speedup_per_seed": [r["sec_per_epoch"] / d["sec_per_epoch"]
                                   for r, d in zip(runs["reference"], runs["dptrain"])], "runs": runs}
    print(json.dumps({k: result[k] for k in ("summary", "speedup_per_seed")}, indent=1))
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
