"""``dptrain train --processes 2`` and torchrun, as users run them: output, failures, leftovers."""
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from dptrain.distributed.launcher import free_port
from dptrain.outputs.checkpoint import load_checkpoint
from tests.signals import signal_in_second_epoch
from tests.warm import dptrain_cli

QUICK = ["--epochs", "2", "--max-batches", "4", "--eval-batches", "4", "--batch-size", "64"]


def run(args, timeout=300, env=None):
    """``python -m dptrain *args``, forked warm (its workers are real interpreters)."""
    return dptrain_cli(args, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout)


def children(pid):
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def worker_of_rank(launcher_pid: int, rank: int) -> int:
    return next(p for p in children(launcher_pid) if f"RANK={rank}\0".encode() in Path(f"/proc/{p}/environ").read_bytes())


def signal_a_worker(data_dir, rank, sig, *extra):
    """``dptrain train --processes 2`` for long; once epoch 1 is reported, ``sig`` to the worker
    of ``rank``. Returns the exit code (which must come within 30 s), stderr and the workers."""
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", "train", "--data-dir", data_dir, "--processes", "2",
                             "--epochs", "1000", "--max-batches", "3", "--eval-batches", "1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert proc.stdout.readline().startswith("epoch 1,")       # training is under way
        workers = children(proc.pid)
        assert len(workers) == 2
        os.kill(worker_of_rank(proc.pid, rank), sig)
        start = time.monotonic()
        code = proc.wait(timeout=60)
        assert time.monotonic() - start < 30
        return code, proc.stderr.read(), workers
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("recipe", ["lenet-scratch", "lenet-mnist"])
def test_two_processes_print_like_one_and_train_the_same(data_dir, recipe):
    one = run(["train", "--recipe", recipe, "--data-dir", data_dir, "--devices", "1", "--json", *QUICK])
    two = run(["train", "--recipe", recipe, "--data-dir", data_dir, "--processes", "2", "--json", *QUICK])
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)          # one JSON object: rank 0 only
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert b["epochs"] == 2 and b["batch_size"] == 64 and b["devices"] == ["cpu:0"]
    for x, y in zip(a["history"], b["history"]):
        assert y["train_loss"] == pytest.approx(x["train_loss"], rel=1e-4)
        assert y["test_acc"] == pytest.approx(x["test_acc"], abs=0.01)
    assert two.stderr.count("epoch 1,") == 1


def test_a_killed_worker_ends_the_job_and_leaves_nothing(data_dir):
    code, err, workers = signal_a_worker(data_dir, 1, signal.SIGKILL)
    assert code == 1
    assert "rank 1 of 2 failed (killed by SIGKILL); stopped the other workers" in err
    time.sleep(0.5)
    assert not [p for p in workers if alive(p)]


def test_workers_that_fail_report_the_rank_and_its_error(tmp_path):
    out = run(["train", "--processes", "2", "--data-dir", str(tmp_path)],
              env={"XDG_CACHE_HOME": str(tmp_path), "DPTRAIN_MIRROR": "http://127.0.0.1:9/"})
    assert out.returncode == 1
    assert "exit code 1)" in out.stderr and "missing train-images" in out.stderr


def test_a_rank_whose_own_code_raises_is_named_with_its_exception_not_the_rank_stopped_for_it():
    out = run(["train", "--recipe", "tests/tasks/user_task.py:make_failing_on_rank_1", "--processes", "2"])
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("dptrain: error: RuntimeError: rank 1's data factory broke (in your code: ") \
        and "user_task.py, line" in last and "(rank 1 of 2, exit code 1)" in last, out.stderr


def test_nccl_without_gpus_is_a_clear_error():
    out = run(["train", "--processes", "2", "--backend", "nccl"])
    assert out.returncode == 2
    assert "--backend nccl needs GPUs" in out.stderr and "Traceback" not in out.stderr


def test_torchrun_two_nodes_on_loopback(data_dir):
    """Two torchrun launches, as on two machines (--nnodes 2), meeting on 127.0.0.1."""
    port = str(free_port())
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    nodes = [subprocess.Popen([str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                               "--master-addr", "127.0.0.1", "--master-port", port,
                               "-m", "dptrain", "train", "--data-dir", data_dir, "--json", *QUICK],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in (0, 1)]
    outs = []
    try:
        for node in nodes:
            outs.append(node.communicate(timeout=300))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [n.returncode for n in nodes] == [0, 0], outs
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    assert result["world_size"] == 2 and result["backend"] == "gloo"
    assert outs[1][0].strip() == ""          # only rank 0 prints


def test_two_processes_resume_bit_identical(data_dir, tmp_path):
    """Rank 0 writes the checkpoint; both ranks resume from it; the history matches an unbroken run."""
    base = ["train", "--data-dir", data_dir, "--processes", "2", "--json", "--max-batches", "3",
            "--eval-batches", "2", "--batch-size", "64"]
    whole = run(base + ["--epochs", "3", "--checkpoint-dir", str(tmp_path / "a")])
    first = run(base + ["--epochs", "1", "--checkpoint-dir", str(tmp_path / "b")])
    resumed = run(base + ["--epochs", "3", "--checkpoint-dir", str(tmp_path / "b"), "--resume"])
    assert whole.returncode == first.returncode == resumed.returncode == 0, resumed.stderr
    strip = lambda out: [{k: v for k, v in h.items() if k != "sec"} for h in json.loads(out)["history"]]  # noqa: E731
    assert strip(resumed.stdout) == strip(whole.stdout)


@pytest.mark.parametrize("ahead", ["0", "1"])
def test_two_processes_stopped_mid_epoch_resume_bit_identical(data_dir, tmp_path, ahead, monkeypatch):
    """SIGINT to the launcher: both ranks stop after the same batch, rank 0 saves, both exit 130;
    the resumed run's history equals an unbroken run's. Also with the host a step ahead."""
    monkeypatch.setenv("DPTRAIN_RUN_AHEAD", ahead)
    base = ["train", "--data-dir", data_dir, "--processes", "2", "--json", "--epochs", "2",
            "--max-batches", "150", "--eval-batches", "2", "--batch-size", "64"]
    whole = run(base + ["--checkpoint-dir", str(tmp_path / "a")])
    assert whole.returncode == 0, whole.stderr
    metrics = tmp_path / "b.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", *base, "--checkpoint-dir", str(tmp_path / "b"),
                             "--metrics", str(metrics)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    err = signal_in_second_epoch(proc, metrics, signal.SIGINT)
    assert proc.returncode == 130, err
    assert "stopped by SIGINT at epoch 2, batch" in err and "--resume" in err and "rank 1" not in err
    resumed = run(base + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "at epoch 2, batch 0" not in resumed.stderr
    strip = lambda out: [{k: v for k, v in h.items() if k != "sec"} for h in json.loads(out)["history"]]  # noqa: E731
    assert strip(resumed.stdout) == strip(whole.stdout)


@pytest.mark.parametrize("ahead", ["0", "1"])
def test_two_processes_skip_or_stop_on_nan_together(data_dir, ahead, monkeypatch):
    monkeypatch.setenv("DPTRAIN_RUN_AHEAD", ahead)
    base = ["train", "--data-dir", data_dir, "--processes", "2", "--epochs", "1", "--max-batches", "6",
            "--eval-batches", "1", "--batch-size", "64", "--lr", "1e30"]
    skipped = run(base + ["--on-nan", "skip", "--json"])
    assert skipped.returncode == 0, skipped.stderr
    assert json.loads(skipped.stdout.strip().splitlines()[-1])["skipped_batches"] >= 1
    stopped = run(base)
    assert stopped.returncode == 1
    assert "the loss became NaN or infinite at epoch 1, batch" in stopped.stderr


def interrupted_and_resumed(base, tmp_path):
    """Run ``base`` whole into ``a``; again into ``b``, SIGINT in its second epoch, then
    --resume; return both results' histories (without seconds)."""
    whole = run(base + ["--checkpoint-dir", str(tmp_path / "a")])
    assert whole.returncode == 0, whole.stderr
    metrics = tmp_path / "b.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", *base, "--checkpoint-dir", str(tmp_path / "b"),
                             "--metrics", str(metrics)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = signal_in_second_epoch(proc, metrics, signal.SIGINT)
    assert proc.returncode == 130, err
    resumed = run(base + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    strip = lambda out: [{k: v for k, v in h.items() if k != "sec"} for h in json.loads(out)["history"]]  # noqa: E731
    return strip(whole.stdout), strip(resumed.stdout)


def test_a_user_task_on_two_processes_stopped_mid_epoch_resumes_bit_identical(tmp_path):
    """The same for your own Task (AdamW, a per-batch schedule, dropout) on two processes."""
    whole, resumed = interrupted_and_resumed(["train", "--recipe", "tests/tasks/user_task.py:make", "--processes",
                                              "2", "--json", "--epochs", "2", "--max-batches", "600"], tmp_path)
    assert resumed == whole


def test_dptrain_launch_runs_a_user_script_on_two_processes():
    """examples/train_your_own.py under `dptrain launch`: one result line, from rank 0."""
    out = run(["launch", "--processes", "2", "examples/train_your_own.py", "--epochs", "2"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("test mae ") and sum(ln.startswith("test mae") for ln in lines) == 1
    assert "2 processes x [cpu:0]" in out.stdout


def test_a_stopped_worker_is_named_within_the_timeout_and_leaves_nothing(data_dir):
    """SIGSTOP on rank 1: its heartbeat stops; rank 0 names it and ends within --timeout."""
    code, err, workers = signal_a_worker(data_dir, 1, signal.SIGSTOP, "--timeout", "4")
    assert code == 1
    assert "rank 1 of 2 stopped answering (no heartbeat for 4 s)" in err
    assert err.count("dptrain: error: ") == 1, err
    time.sleep(0.5)
    assert not [p for p in workers if alive(p)]


def test_user_callbacks_on_two_processes_survive_a_ctrl_c_resume(tmp_path):
    """Early stopping and a learning-rate logger (tests/tasks/user_task.py) on two processes:
    every rank stops after epoch 4, and a resumed run ends with the unbroken run's history and
    callback states."""
    whole, resumed = interrupted_and_resumed(["train", "--recipe", "tests/tasks/user_task.py:make_with_callbacks",
                                              "--processes", "2", "--json", "--max-batches", "400"], tmp_path)
    assert len(whole) == 4 and resumed == whole
    a, b = load_checkpoint(tmp_path / "a")["callbacks"], load_checkpoint(tmp_path / "b")["callbacks"]
    assert a == b and a["StopWhenFlat"]["seen"] == [1, 2, 3, 4] and len(a["LogLearningRate"]["logged"]) == 32


def test_ten_fits_in_one_launched_script():
    """A second fit in a launched script used to wait for a process group the first had
    ended; ten different fits run, and train as the same script on 2 devices of one process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched = run(["launch", "--processes", "2", "tests/tasks/many_fits.py"])
    assert launched.returncode == 0, launched.stderr
    alone = subprocess.run([sys.executable, "tests/tasks/many_fits.py"], capture_output=True, text=True,
                           env={**env, "DEVICES": "2"}, timeout=300)
    assert alone.returncode == 0, alone.stderr
    rows = [[line.split() for line in out.stdout.splitlines() if line.startswith("fit ")] for out in (launched, alone)]
    assert [r[1] for r in rows[0]] == [f"{i}:" for i in range(10)] and len(rows[1]) == 10
    for a, b in zip(*rows):
        assert abs(float(a[2]) - float(b[2])) < 1e-4 and abs(float(a[3]) - float(b[3])) < 1e-4, (a, b)


def test_ctrl_c_in_a_launched_script_ends_in_one_line_with_code_130():
    out = run(["launch", "--processes", "2", "tests/tasks/interrupted_fit.py"])
    assert out.returncode == 130, out.stderr
    assert "Traceback" not in out.stderr and "not reached" not in out.stdout
    assert "dptrain: stopped by SIGINT at epoch 1, batch 3 (no checkpoint_dir: nothing saved)" in out.stderr, \
        out.stderr


def test_ctrl_c_while_the_workers_import_torch_ends_in_one_line_with_code_130(data_dir):
    """A Ctrl-C a moment after the workers start lands while they import torch (about a
    second here): they end quietly, not with an import traceback under the launcher's line."""
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", "train", "--data-dir", data_dir, "--processes", "2",
                             *QUICK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while len(children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(children(proc.pid)) >= 2, "the workers did not start"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "dptrain: SIGINT: all workers stopped" in err and "epoch 1" not in out, (out, err)


@pytest.mark.parametrize("endpoint, nnodes, expected", [
    ("node0:29500", "2", ("node0", 29500)),
    ("127.0.0.1", "2", ("127.0.0.1", 29400)),           # torchrun's port when none is given
    ("[::1]:29501", "1:2", ("::1", 29501)),
    (None, "1", None),
])
def test_a_rendezvous_endpoint_is_read_as_host_and_port(endpoint, nnodes, expected, monkeypatch):
    monkeypatch.setattr("socket.getaddrinfo", lambda *a, **k: [])        # no name service needed
    from dptrain.distributed.launcher import check_endpoint
    assert check_endpoint(endpoint, nnodes) == expected


@pytest.mark.parametrize("endpoint, nnodes, says", [
    (None, "2", "--nnodes 2 needs --rdzv-endpoint"),
    (None, "1:3", "--nnodes 1:3 needs --rdzv-endpoint"),
    ("node0:0", "2", "give HOST:PORT"),
    (":29500", "2", "give HOST:PORT"),
    ("nosuchhost.invalid:29500", "2", "'nosuchhost.invalid' does not resolve"),
])
def test_a_rendezvous_endpoint_that_cannot_work_is_refused(endpoint, nnodes, says):
    from dptrain.distributed.launcher import check_endpoint
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        check_endpoint(endpoint, nnodes)


@pytest.mark.parametrize("how", ["torchrun variables", "--nnodes 2"])
def test_ctrl_c_while_waiting_for_a_peer_says_so_in_one_line(data_dir, how):
    """A peer (or machine) that never comes, then Ctrl-C: one line saying what was interrupted."""
    port = free_port()
    if how == "--nnodes 2":
        args, env = ["--nnodes", "2", "--processes", "1", "--rdzv-endpoint", f"127.0.0.1:{port}"], {}
        said = "dptrain: interrupted"
    else:
        args, env = [], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        said = "dptrain: interrupted (while joining the process group as rank 0 of 2)"
    # As a terminal starts it: Ctrl-C not ignored (a test run started in the background, as
    # `cmd &` in a script, ignores SIGINT, and its children inherit that: they rightly ignore it).
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", "train", "--data-dir", data_dir, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    from dptrain.distributed.join import listening
    deadline = time.monotonic() + 120
    try:
        while not listening("127.0.0.1", port):         # the rendezvous is up: it waits for the peer
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:         # (not left waiting for its peer)
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [said], err


def test_on_torch_2_3_a_restart_leaves_the_rendezvous_open(monkeypatch):
    """torch 2.3's agent closed its rendezvous when it stopped the workers for a restart
    (pytorch#123678): its restart runs with the handler out of its _shutdown's reach, and
    gets it back after; other versions are left as they are."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from dptrain.distributed import launcher
    seen = []

    def restart(agent, group):              # the engine's: its _shutdown closes _rdzv_handler
        seen.append((agent._rdzv_handler, group))
    monkeypatch.setattr(LocalElasticAgent, "_restart_workers", restart)
    monkeypatch.setattr(LocalElasticAgent, "_dptrain_keeps_rendezvous", False, raising=False)
    monkeypatch.setattr(launcher, "torch_release", lambda: (2, 13))
    launcher.keep_rendezvous_on_restart()
    assert LocalElasticAgent._restart_workers is restart
    monkeypatch.setattr(launcher, "torch_release", lambda: (2, 3))
    launcher.keep_rendezvous_on_restart()
    launcher.keep_rendezvous_on_restart()   # once
    agent = types.SimpleNamespace(_rdzv_handler="the rendezvous")
    LocalElasticAgent._restart_workers(agent, "group")
    assert seen == [(None, "group")] and agent._rdzv_handler == "the rendezvous"


def test_the_torch_release_is_read_from_its_version(monkeypatch):
    import torch
    from dptrain.distributed.launcher import torch_release
    for version, release in (("2.3.1+cu121", (2, 3)), ("2.13.0+cpu", (2, 13)), ("2.10.0.dev20260101", (2, 10))):
        monkeypatch.setattr(torch, "__version__", version)
        assert torch_release() == release


def failure(local_rank, exitcode, record=None):
    """A worker's failure as torch's agent reports it (``ProcessFailure``'s fields read here)."""
    return types.SimpleNamespace(local_rank=local_rank, exitcode=exitcode, timestamp=0,
                                 message=(record or {}).get("message", f"Signal {-exitcode}"),
                                 error_file_data=record or {})


@pytest.mark.parametrize("blamer", [0, 1])
def test_the_rank_killed_for_not_answering_is_reported_by_the_one_that_named_it(tmp_path, blamer):
    """Under load the agent saw the rank the heartbeat killed end first, and reported it alone
    ("rank 1 of 2 failed (killed by SIGKILL)") beside the line naming it: the blame it left
    (written before the kill) is read from its error file."""
    from dptrain.distributed.launcher import _report
    stopped = 1 - blamer
    line = f"dptrain: error: rank {stopped} of 2 stopped answering (no heartbeat for 4 s): it is stopped"
    (tmp_path / "attempt_0" / str(blamer)).mkdir(parents=True)
    (tmp_path / "attempt_0" / str(blamer) / "error.json").write_text(
        json.dumps({"message": line, "timestamp": 0, "blames": stopped, "rank": blamer}))
    said = _report({stopped: failure(stopped, -signal.SIGKILL)}, str(tmp_path), 2)
    if blamer == 0:     # (its line is on the terminal already)
        assert said == "dptrain: stopped the other workers (rank 0 of 2 named rank 1)"
    else:
        assert said == f"{line} (rank 1 of 2); stopped the other workers"
    # A rank killed from outside, which no worker named, is still named as killed.
    (tmp_path / "attempt_0" / str(blamer) / "error.json").unlink()
    assert f"rank {stopped} of 2 failed (killed by SIGKILL)" in _report(
        {stopped: failure(stopped, -signal.SIGKILL)}, str(tmp_path), 2)


def test_a_signal_that_torchs_agent_turns_into_another_error_is_still_the_ctrl_c(monkeypatch, capsys):
    """A Ctrl-C landing on the first line of torch's metrics wrapper (``start = time.time()``)
    unwound into its ``finally``, which reads ``start``: an UnboundLocalError, reported as an
    error in "your code", exit 1 (seen once in CI). The signal in its chain is the Ctrl-C."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from dptrain.distributed import launcher

    def elastic_launch(config, entrypoint):
        def run(*args):
            try:
                raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)
                start = 0
            finally:
                print(start)       # noqa: F821 - as the wrapper's finally reads it
        return run
    for name in ("OMP_NUM_THREADS", "DPTRAIN_LAUNCHED", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "GLOO_SOCKET_IFNAME",
                 "DPTRAIN_JOB_START"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))       # (launch sets them: put back after)
    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch", elastic_launch)
    assert launcher.launch(["-c", "pass"], 1) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "dptrain: SIGINT: all workers stopped"
    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch",
                        lambda config, entrypoint: lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):          # another error, no signal in it: as it is
        launcher.launch(["-c", "pass"], 1)
