"""Checkpoints: atomic, safe to load, and a resumed run ends bit-identical to an unbroken one."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dptrain.outputs.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from dptrain.core.errors import CheckpointError
from dptrain.cli.main import main
from tests.signals import signal_in_second_epoch
from tests.warm import dptrain_cli

QUICK = ["--epochs", "3", "--max-batches", "4", "--eval-batches", "2", "--batch-size", "64", "--json"]


def run_json(capsys, *args):
    assert main(["train", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("recipe", ["lenet-scratch", "lenet-mnist"])
def test_resume_after_an_epoch_is_bit_identical(data_dir, tmp_path, capsys, recipe):
    base = ["--recipe", recipe, "--data-dir", data_dir, "--devices", "2", *QUICK]
    whole = run_json(capsys, *base, "--checkpoint-dir", str(tmp_path / "a"))
    # The same run cut after epoch 1 (as if killed then), then resumed.
    run_json(capsys, *[a if a != "3" else "1" for a in base], "--checkpoint-dir", str(tmp_path / "b"))
    resumed = run_json(capsys, *base, "--checkpoint-dir", str(tmp_path / "b"), "--resume")
    strip = lambda h: [{k: v for k, v in row.items() if k != "sec"} for row in h]   # noqa: E731
    assert strip(resumed["history"]) == strip(whole["history"])
    a, b = load_checkpoint(tmp_path / "a")["engine"], load_checkpoint(tmp_path / "b")["engine"]
    flat = lambda s: [t for t in (s["params"] if "params" in s else s["model"].values())]   # noqa: E731
    for x, y in zip(flat(a), flat(b)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("sig, ahead", [(signal.SIGINT, "0"), (signal.SIGTERM, "1")])
def test_a_signal_saves_mid_epoch_and_resume_matches(data_dir, tmp_path, sig, ahead):
    """Also with the host running a step ahead of what it reads back (as on GPUs)."""
    args = ["train", "--data-dir", data_dir, "--devices", "1",
            "--epochs", "2", "--max-batches", "150", "--eval-batches", "2", "--batch-size", "64", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPTRAIN_RUN_AHEAD": ahead}
    whole = json.loads(dptrain_cli(args + ["--checkpoint-dir", str(tmp_path / "a")], env=env).stdout)
    metrics = tmp_path / "b.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", *args, "--checkpoint-dir", str(tmp_path / "b"),
                             "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err = signal_in_second_epoch(proc, metrics, sig)
    assert proc.returncode == 130, err
    assert f"stopped by {sig.name} at epoch 2, batch" in err and "--resume" in err
    resumed = json.loads(dptrain_cli(args + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"], env=env).stdout)
    assert [r["train_loss"] for r in resumed["history"]] == [r["train_loss"] for r in whole["history"]]
    assert [r["test_acc"] for r in resumed["history"]] == [r["test_acc"] for r in whole["history"]]


WRITER = """
import sys, torch
from dptrain.outputs.checkpoint import save_checkpoint
big = torch.randn(8_000_000)
i = 0
while True:
    i += 1
    save_checkpoint(sys.argv[1], {"step": i, "big": big})
    print(i, flush=True)
"""


def test_a_process_killed_mid_save_leaves_a_loadable_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()                      # one complete save
        time.sleep(0.15)                            # then kill it somewhere in the next ones
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    state = load_checkpoint(tmp_path)
    assert state["step"] >= 1 and state["big"].numel() == 8_000_000


def test_loading_is_weights_only_and_errors_are_one_line(tmp_path):
    save_checkpoint(tmp_path, {"x": torch.ones(2)})
    assert torch.equal(load_checkpoint(tmp_path)["x"], torch.ones(2))
    path = tmp_path / "checkpoint.pt"
    # A pickle that would run code is refused, not executed.
    torch.save({"format": FORMAT, "evil": os.system}, path)
    with pytest.raises(CheckpointError, match="corrupt or truncated, or not a dptrain checkpoint"):
        load_checkpoint(tmp_path)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(tmp_path)
    torch.save({"weights": torch.ones(1)}, path)
    with pytest.raises(CheckpointError, match="not a dptrain checkpoint"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist; run once with --checkpoint-dir"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        load_checkpoint(tmp_path / "empty")


def test_a_checkpoint_of_another_run_is_refused(data_dir, tmp_path, capsys):
    run_json(capsys, "--data-dir", data_dir, "--epochs", "1", "--max-batches", "1", "--eval-batches", "1",
             "--checkpoint-dir", str(tmp_path), "--json")
    assert main(["train", "--recipe", "lenet-mnist", "--data-dir", data_dir, "--epochs", "2",
                 "--checkpoint-dir", str(tmp_path), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "is of another run: recipe 'lenet-scratch' (this run: 'lenet-mnist')" in err


def test_resume_without_a_directory_is_a_usage_error(capsys):
    assert main(["train", "--resume"]) == 2
    assert "--resume needs --checkpoint-dir" in capsys.readouterr().err


def interrupted_and_resumed(recipe, tmp_path, *more):
    """Run ``recipe`` on one device whole into ``a``; again into ``b``, SIGINT after its
    first epoch, then --resume; return both histories (without seconds) and the stop line."""
    args = ["train", "--recipe", recipe, "--devices", "1", "--json", *more]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = dptrain_cli(args + ["--checkpoint-dir", str(tmp_path / "a")], env=env)
    assert whole.returncode == 0, whole.stderr
    metrics = tmp_path / "b.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", *args, "--checkpoint-dir", str(tmp_path / "b"),
                             "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err = signal_in_second_epoch(proc, metrics, signal.SIGINT)
    assert proc.returncode == 130 and "stopped by SIGINT at epoch" in err, err
    resumed = dptrain_cli(args + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"], env=env)
    assert resumed.returncode == 0, resumed.stderr
    strip = lambda out: [{k: v for k, v in h.items() if k != "sec"} for h in json.loads(out)["history"]]  # noqa: E731
    return strip(whole.stdout), strip(resumed.stdout), err, whole.stderr


def test_a_user_task_stopped_mid_epoch_resumes_bit_identical(tmp_path):
    """Your own Task (dict batches from a Dataset, dropout, AdamW, a per-batch cosine schedule):
    SIGINT in epoch 2, then --resume, ends where an unbroken run ends, bit for bit."""
    whole, resumed, err, _ = interrupted_and_resumed("tests/tasks/user_task.py:make", tmp_path, "--epochs", "2",
                                                     "--max-batches", "800")   # epoch 2 (2 s) outlasts the 0.5 s wait
    assert "stopped by SIGINT at epoch 2, batch" in err, err
    assert resumed == whole
    a, b = load_checkpoint(tmp_path / "a")["engine"], load_checkpoint(tmp_path / "b")["engine"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert a["trainer"]["groups"] == b["trainer"]["groups"]          # the scheduler's learning rates too


def test_a_changed_checkpoint_is_refused_by_its_digest(tmp_path):
    """100 weights bit-flipped after the save: caught on load, not trained on."""
    save_checkpoint(tmp_path, {"engine": {"w": torch.randn(1000)}, "epoch": 3})
    path = tmp_path / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    w = state["engine"]["w"]
    flipped = w.view(torch.int32)
    flipped[:100] ^= 1 << 30                    # values up to ~1e5 times larger
    torch.save(state, path)                    # the old digest, new contents
    with pytest.raises(CheckpointError, match="is corrupt: its contents do not match the digest"):
        load_checkpoint(tmp_path)
    state["format"] = "dptrain-checkpoint-1"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="written by another version of dptrain"):
        load_checkpoint(tmp_path)


@pytest.fixture
def small_disk(tmp_path):
    """A 300 kB tmpfs (needs root, as in CI; skipped otherwise)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(small_disk):
    save_checkpoint(small_disk, {"x": torch.zeros(10_000)})            # 40 kB: fits
    with pytest.raises(CheckpointError, match="could not write the checkpoint .*: No space left on device "
                                              r"\(the previous checkpoint is kept\)"):
        save_checkpoint(small_disk, {"x": torch.zeros(100_000)})       # 400 kB: does not
    assert load_checkpoint(small_disk)["x"].numel() == 10_000
    assert [p.name for p in small_disk.iterdir()] == ["checkpoint.pt"]  # no temp file left


def test_ctrl_c_is_answered_at_once_and_a_second_one_stops_now(tmp_path):
    """In a one-second batch: the first Ctrl-C is acknowledged before the batch ends; a second
    one stops the run at once, saving nothing."""
    proc = subprocess.Popen([sys.executable, "-m", "dptrain", "train", "--recipe", "tests/tasks/user_task.py:make_slow",
                             "--devices", "1", "--max-batches", "30", "--checkpoint-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []
    reader = __import__("threading").Thread(target=lambda: lines.extend((time.monotonic(), ln) for ln in proc.stderr),
                                            daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any("a step begins" in ln for _, ln in lines):     # in a batch (a slow start-up is not)
        assert time.monotonic() < deadline and proc.poll() is None, lines
        time.sleep(0.05)
    time.sleep(0.2)
    first = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    second = time.monotonic()
    assert proc.wait(timeout=30) == 130
    reader.join(timeout=5)
    acks = [t for t, ln in lines if "SIGINT: stopping after this batch and saving to" in ln]
    assert acks and acks[0] - first < 0.5, lines
    assert any("stopped now, without saving" in ln for _, ln in lines), lines
    assert time.monotonic() - second < 5
    assert not (tmp_path / "checkpoint.pt").exists()


def test_user_callbacks_survive_a_ctrl_c_resume(tmp_path):
    """Early stopping and a learning-rate logger (tests/tasks/user_task.py): SIGINT after
    epoch 1, then --resume, stops after the same epoch with the same history and callback states."""
    whole, resumed, _, said = interrupted_and_resumed("tests/tasks/user_task.py:make_with_callbacks", tmp_path,
                                                      "--max-batches", "800")     # long enough for the signal
    assert "stopped after epoch 4: test loss not better for 3 epochs" in said
    assert len(whole) == 4 and resumed == whole
    a, b = load_checkpoint(tmp_path / "a")["callbacks"], load_checkpoint(tmp_path / "b")["callbacks"]
    assert a == b and a["StopWhenFlat"]["seen"] == [1, 2, 3, 4] and len(a["LogLearningRate"]["logged"]) == 4 * 800 // 50


def test_built_in_callbacks_survive_a_ctrl_c_resume(tmp_path):
    """EarlyStopping (restoring the best weights), BestCheckpoint and EMA (evaluated): SIGINT
    after epoch 1, --resume, and the run ends as an unbroken one: same epochs, best weights
    file, EMA weights, weights kept to restore, to the last bit."""
    whole, resumed, _, said = interrupted_and_resumed("tests/tasks/user_task.py:make_with_builtin_callbacks",
                                                      tmp_path, "--max-batches", "800")
    assert "stopped after epoch 4: test_loss did not improve for 3 epoch(s)" in said
    assert "restored the weights of epoch 1 (test_loss" in said
    assert len(whole) == 4 and resumed == whole
    a, b = load_checkpoint(tmp_path / "a")["callbacks"], load_checkpoint(tmp_path / "b")["callbacks"]
    kept_a, kept_b = a["EarlyStopping"].pop("best_weights"), b["EarlyStopping"].pop("best_weights")
    files_a, files_b = a["BestCheckpoint"].pop("kept"), b["BestCheckpoint"].pop("kept")   # in runs a and b
    assert [(*k[:-1], os.path.basename(k[-1])) for k in files_a] == [(*k[:-1], os.path.basename(k[-1])) for k in files_b]
    assert a["EarlyStopping"] == b["EarlyStopping"] and a["BestCheckpoint"] == b["BestCheckpoint"]
    assert a["EMA"]["updates"] == b["EMA"]["updates"] == 4 * 800
    for k, v in a["EMA"]["weights"].items():
        assert torch.equal(v, b["EMA"]["weights"][k]), k
        assert torch.equal(kept_a[k], kept_b[k]), k
    best_a, best_b = (torch.load(tmp_path / d / "best.pt", weights_only=True) for d in "ab")
    assert best_a["epoch"] == best_b["epoch"] == a["BestCheckpoint"]["best_epoch"]
    for k, v in best_a["model"].items():
        assert torch.equal(v, best_b["model"][k]), k


def test_resume_refuses_another_loss_model_or_data(tmp_path):
    import torch
    from torch import nn
    import dptrain
    from dptrain.core.errors import CheckpointError

    def fit(loss=nn.MSELoss(), width=8, n=64, epochs=1, **kw):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        X = torch.randn(n, 4, generator=g)
        return dptrain.fit(nn.Sequential(nn.Linear(4, width), nn.Linear(width, 1)), (X, X.sum(1, keepdim=True)),
                           loss=loss, epochs=epochs, batch_size=16, devices=1, checkpoint_dir=str(tmp_path), log=None,
                           **kw)
    fit()
    for kw, what in (({"loss": nn.L1Loss()}, "loss 'MSELoss"), ({"width": 6}, "model '"),
                     ({"n": 60}, "training data '64 samples"), ({"shuffle": False}, "shuffle True")):
        with pytest.raises(CheckpointError, match=f"is of another run: {what}"):
            fit(epochs=2, resume=True, **kw)
    assert fit(epochs=2, resume=True)["history"][-1]["epoch"] == 2
