"""The benchmark scripts run in their smoke modes, so they cannot rot: the everyday-programs
suite (issue 22; every framework's loop on a program in one process and in two, and the
evaluations) and the processes benchmark (lenet-scratch on 2 processes against DDP)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_everyday_programs_suite_runs_in_smoke_mode(tmp_path):
    pytest.importorskip("accelerate")
    out = tmp_path / "programs.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_programs.py"), "--smoke",
                           "--programs", "tiny-mlp,hf-style", "--processes", "tiny-mlp", "--evaluation", "text",
                           "--interleaved", "tiny-mlp", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    got = {(r["part"], r["program"], r["variant"]) for r in rows}
    for variant in ("plain loop", "plain loop, tensors indexed", "dptrain, 1 device", "dptrain, auto",
                    "dptrain, 2 virtual devices", "accelerate"):
        assert ("1 process", "tiny-mlp", variant) in got
    assert ("1 process", "hf-style", "dptrain, 1 device") in got
    assert {v for p, prog, v in got if p == "2 processes"} == {"ddp", "accelerate", "dptrain"}
    assert all(r["step_us"] > 0 for r in rows)
    mine = next(r for r in rows if r["variant"] == "dptrain, 1 device" and r["program"] == "tiny-mlp")
    assert "x plain loop" in mine and "x accelerate" in mine
    evaluated = next(r for r in rows if r["part"] == "evaluation" and r["variant"] == "dptrain, 1 device")
    assert evaluated["program"] == "text" and evaluated["step_us"] > 0 and "x plain loop" in evaluated
    turns = [r for r in rows if r["part"] == "1 process, interleaved"]
    assert [(r["program"], r["variant"]) for r in turns] == [("tiny-mlp", "plain loop"),
                                                              ("tiny-mlp", "dptrain, 1 device")]
    assert turns[1]["x plain loop"] > 0 and turns[1]["pairs"] == 2       # 3 epochs each, the first not paired


def epochs_logged(log, name, epochs, gate):
    """A variant for take_turns: ``epochs`` epochs of 50 ms, each logged with its times."""
    import time
    for epoch in range(epochs):
        gate()
        start = time.time()
        time.sleep(0.05)
        with open(log, "a") as f:
            f.write(f"{name} {epoch} {start} {time.time()}\n")
    return name


def test_variants_take_turns_epoch_by_epoch_one_at_a_time(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from turns import take_turns
        log = tmp_path / "log.txt"
        got = take_turns({"a": (epochs_logged, (str(log), "a", 3)), "b": (epochs_logged, (str(log), "b", 2)),
                          "c": (epochs_logged, (str(log), "c", 3))})
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert got == {"a": "a", "b": "b", "c": "c"}
    rows = [line.split() for line in log.read_text().splitlines()]
    assert [f"{name}{epoch}" for name, epoch, _, _ in rows] == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "c2"]
    times = [(float(start), float(end)) for _, _, start, end in rows]
    assert all(end <= next_start for (_, end), (next_start, _) in zip(times, times[1:]))     # never two at once


def failing(gate):
    gate()
    raise ValueError("this variant broke")


def test_a_variant_that_fails_is_reported_and_the_others_finish(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from turns import take_turns
        with pytest.raises(RuntimeError, match="b: ValueError: this variant broke"):
            take_turns({"a": (epochs_logged, (str(tmp_path / "log.txt"), "a", 2)), "b": (failing, ())})
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert len((tmp_path / "log.txt").read_text().splitlines()) == 2


@pytest.mark.slow
def test_the_processes_benchmark_runs_in_smoke_mode(tmp_path):
    """bench_processes (the reference comparison: lenet-scratch on 2 processes against DDP)
    rotted once unnoticed; its smoke mode runs every variant on a few random batches."""
    out = tmp_path / "processes.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_processes.py"), "--smoke",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["lenet-scratch"]
    assert set(figures["images_per_sec"]) == {"dptrain 2 proc x 1 thread", "dptrain 1 proc x 1 thread",
                                              "dptrain 1 proc x 2 threads", "DDP 2 proc x 1 thread"}
    assert all(rate > 0 for rate in figures["images_per_sec"].values())
    assert figures["dptrain_over_ddp"] > 0 and len(figures["per_round"]["DDP 2 proc x 1 thread"]) == 1
