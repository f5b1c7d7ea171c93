"""The GPU suite runs, in its CPU smoke mode, so it is ready the day a GPU is lent."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_suite_runs_in_smoke_mode(data_dir, tmp_path):
    out = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), str(tmp_path), "--data-dir", data_dir,
                          "--smoke"], capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    variants = {(r["model"], r["variant"]) for r in result["rows"]}
    assert ("ResNet-18", "dptrain, bf16 + channels-last") in variants
    assert ("tutorial LeNet", "dptrain, 2 replicas of 1 GPU") in variants
    mixed = [r for r in result["rows"] if "GPU + CPU" in r["variant"]]      # issue 13's cuda:0,cpu:0 case
    assert [r["model"] for r in mixed] == ["tutorial LeNet", "ResNet-18"] and all(sum(r["split"]) > 0 for r in mixed)
    assert all(r["images_per_sec"] > 0 for r in result["rows"])
    assert "| model | variant | s/epoch |" in (tmp_path / "gpu.md").read_text()
    host = json.loads((tmp_path / "host.json").read_text())["results"]
    for program in ("tiny-mlp", "text"):
        for variant in ("plain loop", "dptrain"):
            seen = host[program][variant]
            assert seen["step_us"] > 0 and seen["calls_per_step"] > 0
            assert seen["ops_per_step"]["aten.addmm.default"] >= 1        # a Linear layer's forward, each step
        assert any("direct_step" in k for k in host[program]["dptrain"]["dptrain_us_per_step"])
    assert "ATen operations a step, dptrain minus the plain loop" in (tmp_path / "host.md").read_text()
    fp16 = json.loads((tmp_path / "fp16.json").read_text())["mlp"]
    assert fp16["dptrain fp16 / plain loop (speed)"] > 0


def load_gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_failing_variant_costs_only_itself_and_the_budget_skips_the_rest(tmp_path, monkeypatch):
    """The first run on a GPU is short and precious: a variant that breaks is listed with its
    error, the others are measured; past the budget the rest are listed as skipped."""
    bench = load_gpu_bench()
    clock = [0.0]

    def measured(*args, **kwargs):
        clock[0] += 10.0
        return {"sec_per_epoch": 1.0, "images_per_sec": 100.0}

    def dptrain_run(recipe, args, devices, epochs, **config):
        if (recipe, devices) == ("lenet-mnist", "cpu:0,cpu:0"):
            raise RuntimeError("replicas broke")
        return measured()
    monkeypatch.setattr(bench, "plain_loop", measured)
    monkeypatch.setattr(bench, "dptrain_run", dptrain_run)
    monkeypatch.setattr(bench.time, "time", lambda: clock[0])
    out = tmp_path / "gpu.json"
    monkeypatch.setattr(sys, "argv", ["gpu_bench.py", "--data-dir", "unused", "--out", str(out), "--md",
                                      str(tmp_path / "gpu.md"), "--smoke", "--budget", "115"])
    with pytest.raises(SystemExit, match="1 variant.s. failed: tutorial LeNet, dptrain, 2 replicas of 1 GPU: "
                                         "RuntimeError: replicas broke"):
        bench.main()
    rows = json.loads(out.read_text())["rows"]
    status = ["error" if "error" in r else "skipped" if "skipped" in r else "measured" for r in rows]
    assert status == ["measured"] * 11 + ["error", "measured", "skipped"], status
    assert rows[1]["x_peer"] == 1.0 and "replicas broke" in (tmp_path / "gpu.md").read_text()
