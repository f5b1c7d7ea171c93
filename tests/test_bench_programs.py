"""The benchmark scripts run in their smoke modes, so they cannot rot: the everyday-programs
suite (issue 22; every framework's loop on a program in one process and in two, a GAN's two
optimizers too, and the evaluations) and the processes benchmark (lenet-scratch on 2 processes against DDP)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_everyday_programs_suite_runs_in_smoke_mode(tmp_path):
    pytest.importorskip("accelerate")
    out = tmp_path / "programs.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_programs.py"), "--smoke",
                           "--programs", "tiny-mlp,hf-style", "--processes", "", "--evaluation", "text",
                           "--interleaved", "tiny-mlp", "--interleaved-processes", "tiny-mlp",
                           "--interleaved-evaluation", "text", "--paired", "tiny-mlp", "--paired-evaluation", "text",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    got = {(r["part"], r["program"], r["variant"]) for r in rows}
    for variant in ("plain loop", "plain loop, tensors indexed", "dptrain, 1 device", "dptrain, auto",
                    "dptrain, 2 virtual devices", "accelerate"):
        assert ("1 process", "tiny-mlp", variant) in got
    assert ("1 process", "hf-style", "dptrain, 1 device") in got
    assert all(r["step_us"] > 0 for r in rows)    # (part 2, each framework's job alone: the next test's)
    mine = next(r for r in rows if r["variant"] == "dptrain, 1 device" and r["program"] == "tiny-mlp")
    assert "x plain loop" in mine and "x accelerate" in mine
    evaluated = next(r for r in rows if r["part"] == "evaluation" and r["variant"] == "dptrain, 1 device")
    assert evaluated["program"] == "text" and evaluated["step_us"] > 0 and "x plain loop" in evaluated
    turns = [r for r in rows if r["part"] == "1 process, interleaved"]
    assert [(r["program"], r["variant"]) for r in turns] == [("tiny-mlp", "plain loop"),
                                                              ("tiny-mlp", "dptrain, 1 device")]
    assert turns[1]["x plain loop"] > 0 and turns[1]["pairs"] == 2       # 3 epochs each, the first not paired
    evaluations = [r for r in rows if r["part"] == "evaluation, interleaved"]
    assert [(r["program"], r["variant"]) for r in evaluations] == [("text", "plain loop"), ("text", "dptrain, 1 device")]
    assert evaluations[1]["x plain loop"] > 0 and evaluations[1]["pairs"] == 2
    for part, program in (("1 process, paired", "tiny-mlp"), ("evaluation, paired", "text")):
        pairs = [r for r in rows if r["part"] == part]
        assert [(r["program"], r["variant"]) for r in pairs] == [(program, "plain loop"), (program, "dptrain, 1 device")]
        assert pairs[1]["x plain loop"] > 0 and pairs[1]["pairs"] == 2
    jobs = [r for r in rows if r["part"] == "2 processes, interleaved"]
    assert [r["variant"] for r in jobs] == ["ddp", "accelerate", "dptrain"]
    assert jobs[2]["x ddp"] > 0 and jobs[2]["x accelerate"] > 0 and jobs[2]["pairs"] == 2


@pytest.mark.slow
def test_the_programs_of_several_optimizers_run_in_every_framework_in_smoke_mode(tmp_path):
    """Two optimizers, each framework's way: the GAN's taking turns (DDP and Accelerate: each
    network wrapped; its evaluation too), Muon + AdamW on one loss (Accelerate: each optimizer
    prepared)."""
    pytest.importorskip("accelerate")
    out = tmp_path / "programs.json"
    empty = ["--interleaved", "", "--interleaved-evaluation", "", "--interleaved-processes", "", "--paired-evaluation", ""]
    programs = "gan,muon" if hasattr(torch.optim, "Muon") else "gan"      # (torch.optim.Muon: torch >= 2.9)
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_programs.py"), "--smoke", "--programs",
                           programs, "--processes", programs, "--paired", "gan", "--evaluation", "gan", *empty,
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    got = {(r["part"], r["variant"]) for r in rows}
    assert {v for p, v in got if p == "2 processes"} == {"ddp", "accelerate", "dptrain"}
    assert programs == "gan" or {(r["part"], r["variant"]) for r in rows if r["program"] == "muon"} >= {
        ("2 processes", "ddp"), ("2 processes", "accelerate"), ("2 processes", "dptrain"),
        ("1 process", "plain loop"), ("1 process", "dptrain, 1 device")}
    assert {("1 process", "plain loop"), ("1 process", "dptrain, 1 device"), ("1 process", "accelerate"),
            ("1 process, paired", "dptrain, 1 device"), ("evaluation", "plain loop"),
            ("evaluation", "dptrain, 1 device")} <= got     # (the GAN's evaluation: each step's loss)


@pytest.mark.parametrize("evaluation", [False, True])
def test_paired_in_one_process_the_plain_loop_runs_before_and_after_dptrain_by_turns(evaluation):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import everyday
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    program = everyday.shrink(everyday.PROGRAMS["tiny-mlp"], 4 * 128)
    got = everyday.run_paired(program, 4, evaluation=evaluation)
    assert got["first"] == ["plain loop", "dptrain", "plain loop", "dptrain"]
    assert len(got["plain loop"]["epochs"]) == len(got["dptrain, 1 device"]["epochs"]) == 4
    assert all(t > 0 for t in got["plain loop"]["epochs"] + got["dptrain, 1 device"]["epochs"])
    assert got["plain loop"]["steps"] == (1 if evaluation else 4)     # a quarter of 4 batches; 4 batches


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


# A job of 2 workers, as torchrun starts them: each logs its epochs of 50 ms between gates.
JOB = """
import os, subprocess, sys, time
sys.path.insert(0, {benchmarks!r})
from job_turns import JobGate
name, epochs, worker = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None
if worker is None:          # the 'agent', as torchrun's: a worker fails, the others are stopped
    procs = [subprocess.Popen([sys.executable, sys.argv[0], name, str(epochs), str(w)],
                              env={{**os.environ, "LOCAL_RANK": str(w)}}) for w in range(2)]
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            sys.exit(1)
        time.sleep(0.02)
    sys.exit(max(p.returncode for p in procs))
turns = JobGate.from_env()
turns.gate()                # the set-up
for epoch in range(epochs):
    turns.gate()
    if name == "bad" and epoch == 1 and worker == "0":       # (one traceback in the shared log)
        raise ValueError("this job broke")
    start = time.time()
    time.sleep(0.05)
    with open({log!r}, "a") as f:
        f.write(f"{{name}} {{epoch}} {{worker}} {{start}} {{time.time()}}\\n")
turns.finish()
os.write(1, f"{{name}} done\\n".encode())     # one write: the two workers share the log
"""


def job_commands(tmp_path, jobs):
    script = tmp_path / "job.py"
    script.write_text(JOB.format(benchmarks=str(REPO / "benchmarks"), log=str(tmp_path / "log.txt")))
    return {name: [sys.executable, str(script), name, str(epochs)] for name, epochs in jobs}


def test_jobs_of_several_processes_take_turns_epoch_by_epoch(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from job_turns import take_job_turns
        out = take_job_turns(job_commands(tmp_path, [("a", 3), ("b", 2)]), workers=2)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert out["a"].count("a done") == 2 and out["b"].count("b done") == 2
    rows = [line.split() for line in (tmp_path / "log.txt").read_text().splitlines()]
    turns = [f"{name}{epoch}" for name, epoch, _, _, _ in rows]
    assert turns == [t for t in ["a0", "a0", "b0", "b0", "a1", "a1", "b1", "b1", "a2", "a2"]], turns
    spans = {}
    for name, epoch, _, start, end in rows:     # a job's epoch: from its first worker's start to its last's end
        lo, hi = spans.get((name, epoch), (float(start), float(end)))
        spans[(name, epoch)] = (min(lo, float(start)), max(hi, float(end)))
    ordered = [spans[(t[0], t[1:])] for t in dict.fromkeys(turns)]
    assert all(end <= next_start for (_, end), (next_start, _) in zip(ordered, ordered[1:]))   # never two at once


def test_a_job_that_fails_in_its_turn_is_reported_with_its_traceback(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from job_turns import take_job_turns
        with pytest.raises(RuntimeError, match="(?s)bad ended .*ValueError: this job broke"):
            take_job_turns(job_commands(tmp_path, [("a", 3), ("bad", 3)]), workers=2)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def run_benchmark(tmp_path, script, *args):
    """``benchmarks/SCRIPT ARGS --out FILE`` with one thread; its figures."""
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_train_metrics_benchmark_runs_and_pairs_its_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_train_metrics.py", "--programs", "tiny-mlp,text", "--rounds", "2",
                            "--epochs", "2", "--samples", "512")
    for program in ("tiny-mlp", "text"):
        assert set(figures[program]["raw"]) == {"plain loop", "plain loop + accuracy", "dptrain",
                                                "dptrain, train_metrics"}
        assert all(len(v) == 2 and all(s > 0 for s in v) for v in figures[program]["raw"].values())
        assert figures[program]["dptrain with / without train_metrics"] > 0


def test_the_dropout_benchmark_runs_its_four_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_dropout.py", "--smoke")
    assert figures["command"].startswith("python benchmarks/bench_dropout.py --smoke") and "machine" in figures
    figures = figures["models"]
    assert set(figures) == {"cnn-dropout", "mlp-dropout"}
    for model in figures.values():
        assert len(model["epoch_sec"]) == 4 and all(s > 0 for s in model["epoch_sec"].values())
        assert model["2 devices / shared generator"] > 0


def test_the_stream_and_sampler_benchmark_runs_its_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_stream.py", "--smoke")["programs"]
    assert set(figures) == {"tiny-mlp", "text"} and figures["text"]["batches by length: dptrain / plain loop"] > 0
    for program in figures.values():
        assert len(program["epoch_sec"]) in (9, 11) and all(s > 0 for s in program["epoch_sec"].values())
        assert program["stream 1 device / plain loop"] > 0 and program["weighted sampler: dptrain / plain loop"] > 0
        assert program["a stream of batches: dptrain / plain loop"] > 0
        assert program["stream without __len__ / plain loop"] > 0


def test_the_unfreezing_benchmark_times_one_fit_two_fits_and_the_rebuild(tmp_path):
    figures = run_benchmark(tmp_path, "bench_unfreeze.py", "--smoke")
    assert set(figures["2 device(s)"]["seconds"]) == {"dptrain, one fit", "dptrain, two fits"}
    assert figures["2 device(s)"]["one fit faster by (x)"]["dptrain, two fits"] > 0
    assert figures["rebuild in fit, ms (median)"] > 0
    assert set(figures["rebuild, ms (median of 3)"]) == {"cnn backbone, 2 device(s)",
                                                             "resnet18 stem (the rest's Adam state kept), 2 device(s)"}


def test_the_fp16_benchmark_pairs_dptrain_with_the_grad_scaler_loop(tmp_path):
    figures = run_benchmark(tmp_path, "bench_fp16.py", "--smoke")["mlp"]
    assert set(figures["epoch_sec"]) == {"plain loop, GradScaler", "dptrain fp16", "dptrain bf16"}
    assert figures["dptrain fp16 / plain loop (speed)"] > 0 and figures["dptrain fp16 / dptrain bf16 (speed)"] > 0


def test_the_garbage_collection_benchmark_counts_each_variants_collections(tmp_path):
    figures = run_benchmark(tmp_path, "bench_gc.py", "--smoke")
    assert set(figures["rounds"]) == {f"{data}: {who}" for data in ("tensors", "stream of samples")
                                      for who in ("plain loop", "dptrain")}
    for name, rounds in figures["rounds"].items():
        assert set(rounds[0]["steps"]) == {"gen0", "gen1", "gen2", "gen2_ms"}
        assert ("setup" in rounds[0]) == name.endswith("dptrain")
    assert figures["full_collection_ms"] > 0 and figures["first_optimizer_ms"] > 0


def test_the_lightning_benchmark_trains_one_module_each_way(tmp_path):
    figures = run_benchmark(tmp_path, "bench_lightning.py", "--smoke", "--log-train", "--grad-norm", "--clip-hook",
                            "--transfer-hook", "--callback")
    assert {"plain", "dptrain"} <= set(figures["us_per_step"]) and figures["vs_plain"]["dptrain"] > 0
    assert all(us > 0 for us in figures["us_per_step"].values())


def test_the_optimizers_benchmark_runs_and_pairs_its_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_optimizers.py", "--smoke", "--samples", "2048")
    assert figures["command"].startswith("python benchmarks/bench_optimizers.py --smoke") and "machine" in figures
    assert {"pinn-mlp", "sam-tiny-mlp", "lookahead-tiny-mlp", "group-step-tiny-mlp", "hooked-tiny-mlp"} <= \
        set(figures["programs"])
    for program in figures["programs"].values():
        assert set(program["raw"]) == {"plain", "fit-1", "fit-2"} and all(v[0] > 0 for v in program["raw"].values())
        assert program["fit-1 / plain"] > 0 and program["fit-2 / plain"] > 0


def test_the_swa_benchmark_runs_its_four_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_swa.py", "--smoke")
    assert figures["command"].startswith("python benchmarks/bench_swa.py --smoke") and "machine" in figures
    assert set(figures["raw"]) == {"plain", "plain + SWA", "fit", "fit + SWA"}
    assert all(len(v) == 1 and v[0] > 0 for v in figures["raw"].values())
    assert figures["fit + SWA / plain + SWA (speed)"] > 0


def test_the_forward_hooks_benchmark_runs_its_five_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_forward_hooks.py", "--smoke")
    assert figures["command"].startswith("python benchmarks/bench_forward_hooks.py --smoke")
    assert len(figures["raw"]) == 5 and all(len(v) == 1 and v[0] > 0 for v in figures["raw"].values())
    assert figures["in turn / at once (no hook)"] > 0 and figures["auto chose (devices, each round)"][0] in (1, 2)


def test_the_gradients_benchmark_runs_its_six_variants(tmp_path):
    figures = run_benchmark(tmp_path, "bench_gradients.py", "--smoke")
    assert figures["command"].startswith("python benchmarks/bench_gradients.py --smoke")
    assert len(figures["raw"]) == 6 and all(len(v) == 1 and v[0] > 0 for v in figures["raw"].values())
    assert figures["fit, 2 device(s): on_gradients / without"] > 0


def test_the_manual_optimization_benchmark_pairs_each_way_with_the_plain_loop(tmp_path):
    figures = run_benchmark(tmp_path, "bench_manual.py", "--smoke", "--devices", "1,2", "--no-lightning")
    assert set(figures["x plain (speed)"]) == {f"fit, {kind}, {d} device" for kind in ("manual", "steps in turn")
                                               for d in (1, 2)}
    assert all(s > 0 for s in figures["seconds"].values())


def test_the_lr_find_benchmark_pairs_the_range_test_with_the_plain_loops(tmp_path):
    figures = run_benchmark(tmp_path, "bench_lr_find.py", "--smoke", "--no-lightning")["programs"]
    assert set(figures) == {"tiny-mlp", "text"}
    assert all(set(f["x plain loop (speed)"]) == {"lr_find"} for f in figures.values())


def test_the_weights_benchmark_pairs_its_variants_with_the_plain_loop_weighing_alike(tmp_path):
    result = run_benchmark(tmp_path, "bench_weights.py", "--smoke")
    assert set(result["loss op"]["us a call"]) == {"plain loop's per-sample * w[y]", "ClassWeights.weighted_sum",
                                                   "unweighted cross_entropy"}
    assert all(x > 0 for x in result["loss op"]["us a call"].values())
    figures = result["programs"]
    assert set(figures) == {"tiny-mlp", "text"}
    for program in figures.values():
        assert set(program["raw"]) == {"plain loop, class-weighted", "fit class_weight, 1 device",
                                       "fit unweighted, 1 device", "fit class_weight, 2 devices",
                                       "plain loop, sample-weighted", "fit sample_weight, 1 device",
                                       "fit sample_weight, 2 devices"}
        assert all(len(v) == 1 and v[0] > 0 for v in program["raw"].values())
        assert set(program["fit's evaluation"]["x plain evaluation (speed)"]) == {
            "fit validation_split, held-out part weighed", "fit validation_split, unweighted"}
        assert all(v > 0 for v in program["fit's evaluation"]["evaluation seconds"].values())
        assert all(x > 0 for x in program["x plain loop (speed)"].values())
        assert set(program["evaluation"]["x plain evaluation (speed)"]) == {"evaluate sample_weight, 1 device",
                                                                           "evaluate unweighted, 1 device"}
        assert all(x > 0 for x in program["evaluation"]["x plain evaluation (speed)"].values())
