"""The GPU suite runs, in its CPU smoke mode, so it is ready the day a GPU is lent."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
