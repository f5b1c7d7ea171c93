"""On torchrun's elastic agent: a killed or stopped worker is restarted and the run ends as an
unbroken one; a checkpoint moves between 2 processes, 2 devices and 1; two machines."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dptrain.outputs.checkpoint import load_checkpoint
from dptrain.distributed.launcher import free_port
from tests.distributed.test_launcher import alive, children, run, signal_a_worker, worker_of_rank

QUICK = ["--max-batches", "40", "--eval-batches", "2", "--batch-size", "64", "--json", "--quiet"]


def history(out):
    return [{k: v for k, v in h.items() if k != "sec"} for h in json.loads(out.strip().splitlines()[-1])["history"]]


def weights(folder):
    return load_checkpoint(folder)["engine"]["model"]


def wait_for_epoch_1(metrics: Path, proc) -> None:
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "epoch 1 did not end"
        time.sleep(0.05)
    time.sleep(0.5)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_failed_worker_is_restarted_and_the_run_ends_as_an_unbroken_one(data_dir, tmp_path, sig):
    """--max-restarts 1: rank 1 killed (or stopped: the heartbeat names it) in epoch 2; the
    agent restarts both, they resume from the last checkpoint (--checkpoint-every 10), and
    the history and weights equal an unbroken run's, bit for bit."""
    base = ["train", "--data-dir", data_dir, "--processes", "2", "--epochs", "3", "--timeout", "4", *QUICK]
    whole = run(base + ["--checkpoint-dir", str(tmp_path / "a")])
    assert whole.returncode == 0, whole.stderr
    metrics = tmp_path / "b.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", *base, "--checkpoint-dir", str(tmp_path / "b"),
                             "--max-restarts", "1", "--checkpoint-every", "10", "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_for_epoch_1(metrics, proc)
        os.kill(worker_of_rank(proc.pid, 1), sig)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "dptrain: restart 1 of 1 after a failure: resuming from the last checkpoint" in err
    assert history(out) == history(whole.stdout)
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()] == [1, 2, 3]


def test_without_restarts_the_job_ends_naming_the_rank_and_leaves_nothing(data_dir):
    code, err, workers = signal_a_worker(data_dir, 0, signal.SIGKILL)
    assert code == 1
    assert "dptrain: error: rank 0 of 2 failed (killed by SIGKILL); stopped the other workers" in err
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not [p for p in workers if alive(p)]


def test_a_checkpoint_of_2_processes_resumes_on_2_devices_or_1(data_dir, tmp_path):
    """Epoch 1 on 2 processes, epoch 2 on 1 process with 2 virtual devices, or on 1 device:
    the same as 2 unbroken epochs (up to float rounding: the sums are added in another order)."""
    base = ["train", "--data-dir", data_dir, "--epochs", "2", *QUICK]
    whole = run(base + ["--processes", "2", "--checkpoint-dir", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr
    first = run(base + ["--processes", "2", "--epochs", "1", "--checkpoint-dir", str(tmp_path / "half")])
    assert first.returncode == 0, first.stderr
    want = weights(tmp_path / "whole")
    for devices in ("2", "1"):
        folder = tmp_path / f"on{devices}"
        folder.mkdir()
        (folder / "checkpoint.pt").write_bytes((tmp_path / "half" / "checkpoint.pt").read_bytes())
        resumed = run(base + ["--devices", devices, "--checkpoint-dir", str(folder), "--resume"])
        assert resumed.returncode == 0, resumed.stderr
        assert "resuming on 1 process(es) x" in resumed.stderr and "the same global batches" in resumed.stderr
        got = weights(folder)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-6)
        for a, b in zip(history(resumed.stdout), history(whole.stdout)):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)


def test_torchrun_runs_a_user_script_unchanged():
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "examples/train_your_own.py",
                          "--epochs", "2"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    assert out.returncode == 0, out.stderr
    assert sum(line.startswith("test mae ") for line in out.stdout.splitlines()) == 1


def two_machines(tmp_path, data_dir, extra):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "dptrain", "train", "--data-dir", data_dir, "--nnodes", "2", "--processes", "1",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two", "--epochs", "3", "--timeout", "10", *QUICK,
           *extra]
    return [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]


@pytest.mark.parametrize("restarts", [1, 0])
def test_two_machines_on_loopback(data_dir, tmp_path, restarts):
    """Two agents (--nnodes 2, c10d rendezvous): a worker killed on one of them is recovered
    with --max-restarts; without, both agents end with a clear line."""
    metrics = tmp_path / "m.jsonl"
    extra = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "10", "--metrics", str(metrics),
             "--max-restarts", str(restarts)]
    nodes = two_machines(tmp_path, data_dir, extra)
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().strip()):
            assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), "epoch 1 did not end"
            time.sleep(0.05)
        time.sleep(0.5)
        victim = next(p for n in nodes for p in children(n.pid)
                      if b"RANK=1\0" in Path(f"/proc/{p}/environ").read_bytes())
        os.kill(victim, signal.SIGKILL)
        outs = [n.communicate(timeout=240) for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    codes = [n.returncode for n in nodes]
    if restarts:
        assert codes == [0, 0], outs
        assert [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
    else:
        assert codes == [1, 1], outs
        said = []
        for _, err in outs:        # one line each; the agent that hosted the rendezvous may end first
            errors = [line for line in err.splitlines() if line.startswith("dptrain: error: ")]
            assert len(errors) == 1 and any(s in errors[0] for s in ("of 2 failed", "lost its connection", "lost the job's rendezvous")), err
            assert "Traceback" not in err, err
            said += errors
        assert any("rank 1 of 2 failed" in line for line in said), said
