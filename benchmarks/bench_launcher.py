"""The elastic agent against the launcher it replaced, and the time a restart takes.

    python benchmarks/bench_launcher.py --data-dir ../shared/datasets --baseline-src /tmp/prelaunch/src \\
        --out benchmarks/results/launcher.json

``--baseline-src``: the ``src`` folder of a dptrain checkout from before the agent (commit
bcc131d, ``git worktree add /tmp/prelaunch bcc131d``), whose ``dptrain launch`` started and
watched its own worker processes. Both run this file as the worker script, 2 processes x 1
thread, the Gluon tutorial's LeNet on Fashion-MNIST through ``dptrain.fit``; they take turns.

- start-up: seconds from the command to the first batch (the worker's first step writes the
  time into ``$BENCH_MARKS``);
- steady state: images/s of the second epoch;
- restart (the agent only): rank 1 is killed 1.5 s into training (epoch 2 of 4) with
  ``--max-restarts 1`` and ``checkpoint_every=10``; seconds from the kill to the first batch
  after the restart (at most 10 batches are done again).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def worker(args) -> None:
    """What both launchers start: fit, with a step that marks its first call of each start."""
    import torch
    from torch import nn

    import dptrain
    from dptrain.models import GluonLeNet
    marks, first = os.environ["BENCH_MARKS"], [True]

    def step(model, batch):
        if first[0] and dptrain.rank() == 0:
            with open(marks, "a") as f:
                f.write(f"{time.time()}\n")
            first[0] = False
        return nn.functional.cross_entropy(model(batch[0]), batch[1])
    data = dptrain.load_dataset("fashion-mnist", args.data_dir)
    n = args.batches * 256
    torch.manual_seed(0)
    saving = dict(checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, overwrite=True) \
        if args.checkpoint_dir else {}           # (the launcher before the agent had no checkpoint_every)
    result = dptrain.fit(GluonLeNet(), (data.train_X[:n], data.train_y[:n]), step=step, lr=0.04, batch_size=256,
                         epochs=args.epochs, log=None, progress=False, **saving)
    if dptrain.rank() == 0:
        print(json.dumps({"images_per_sec": n / result["history"][1]["sec"]}), flush=True)


def run(src: str, args, marks: Path, launch_flags=(), script_flags=(), kill_after=None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": src, "BENCH_MARKS": str(marks)}
    command = [sys.executable, "-m", "dptrain", "launch", "--processes", "2", *launch_flags, str(HERE), "--worker",
               "--data-dir", args.data_dir, "--batches", str(args.batches), "--epochs", str(args.epochs),
               *script_flags]
    marks.write_text("")
    start = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    killed = None
    if kill_after is not None:
        killed = kill_after(proc, marks)
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{src} failed:\n{err[-3000:]}")
    starts = [float(x) for x in marks.read_text().split()]
    return {"startup_s": starts[0] - start, "starts": starts, "killed": killed,
            **json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])}


def kill_rank1_in_epoch_2(proc, marks: Path) -> float:
    """Once training runs, wait 1.5 s (into epoch 2), kill rank 1; return when."""
    while not marks.read_text().strip():
        time.sleep(0.02)
    time.sleep(1.5)
    kids = [int(c) for t in Path(f"/proc/{proc.pid}/task").iterdir() for c in (t / "children").read_text().split()]
    rank1 = next(k for k in kids if b"RANK=1\0" in Path(f"/proc/{k}/environ").read_bytes())
    os.kill(rank1, signal.SIGKILL)
    return time.time()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--baseline-src")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--checkpoint-every", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    ours = str(HERE.parents[1] / "src")
    variants = {"elastic agent": ours, **({"own launcher (before)": args.baseline_src} if args.baseline_src else {})}
    raw = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks"
        names = list(variants)
        for rep in range(args.repeats + 1):
            for name in (names if rep % 2 == 0 else names[::-1]):
                result = run(variants[name], args, marks)
                if rep:
                    raw[name].append(result)
        restarts = []
        for k in range(max(1, args.repeats // 2)):
            result = run(ours, argparse.Namespace(**{**vars(args), "epochs": 4}), marks,
                         launch_flags=["--max-restarts", "1"],
                         script_flags=["--checkpoint-dir", str(Path(tmp) / f"ckpt{k}"), "--checkpoint-every", "10"],
                         kill_after=kill_rank1_in_epoch_2)
            restarts.append(result["starts"][-1] - result["killed"])
    out = {
        "machine": f"{platform.processor() or platform.machine()}, 2 processes x 1 thread, gloo on loopback",
        "command": "python benchmarks/bench_launcher.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, False)),
        "startup_s_median": {k: round(statistics.median(r["startup_s"] for r in v), 2) for k, v in raw.items()},
        "images_per_sec_median": {k: round(statistics.median(r["images_per_sec"] for r in v)) for k, v in raw.items()},
        "kill_to_training_again_s": [round(x, 2) for x in restarts],
        "raw": {k: [{"startup_s": r["startup_s"], "images_per_sec": r["images_per_sec"]} for r in v]
                for k, v in raw.items()},
    }
    if args.baseline_src:
        a, b = raw["elastic agent"], raw["own launcher (before)"]
        out["paired_steady_state_ratio"] = round(statistics.median(x["images_per_sec"] / y["images_per_sec"]
                                                                   for x, y in zip(a, b)), 3)
        out["paired_startup_difference_s"] = round(statistics.median(x["startup_s"] - y["startup_s"]
                                                                     for x, y in zip(a, b)), 2)
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
