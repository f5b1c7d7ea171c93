"""Metrics file, progress bar, the non-finite loss guard, and the loop's plain and watched steps."""
import io
import json

import pytest
import torch

import dptrain
from dptrain.cli.main import main
from dptrain.outputs.metrics_file import read_metrics
from dptrain.outputs.progress import ProgressBar


def test_metrics_file_gets_one_record_per_epoch(data_dir, tmp_path, capsys):
    path = tmp_path / "runs" / "m.jsonl"
    args = ["train", "--data-dir", data_dir, "--epochs", "2", "--max-batches", "2", "--eval-batches", "1",
            "--metrics", str(path), "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    records = read_metrics(path)
    assert [r["epoch"] for r in records] == [1, 2]
    assert {"epoch", "sec", "train_loss", "test_acc", "devices", "world_size", "images_per_sec"} <= set(records[0])
    assert records[1]["test_acc"] == result["history"][1]["test_acc"]
    assert main(args) == 2                       # never mixed with another run's records
    assert "already holds 2 record(s) of another run: pass --resume" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2]


def test_a_resumed_run_continues_its_metrics_file(data_dir, tmp_path, capsys):
    path, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    args = ["train", "--data-dir", data_dir, "--max-batches", "2", "--eval-batches", "1", "--metrics", str(path),
            "--checkpoint-dir", str(ckpt), "--quiet"]
    assert main(args + ["--epochs", "2"]) == 0
    with open(path, "a") as f:                   # as if a crash struck after epoch 3's record, before its save
        f.write(json.dumps({**read_metrics(path)[-1], "epoch": 3}) + "\n")
    assert main(args + ["--epochs", "3", "--resume"]) == 0
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2, 3]
    capsys.readouterr()


def test_unwritable_metrics_path(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["train", "--metrics", str(tmp_path / "file" / "m.jsonl")]) == 2
    assert "cannot write the metrics file" in capsys.readouterr().err


def test_progress_bar_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar(10, epoch=3, stream=stream)
        bar.update(10, 640, 0.5)
        bar.close()
    assert "epoch 3 [" in tty.getvalue() and "10/10" in tty.getvalue() and "samples/s" in tty.getvalue()
    assert pipe.getvalue() == ""


def test_the_progress_bar_counts_images_in_img_per_s_and_other_data_in_samples():
    from dptrain.callbacks.outputs import ProgressBar as BarCallback

    class Run:
        def __init__(self, example):
            self.train_loader = type("Loader", (), {"example": lambda _: example})()
    units = []
    for example in ((torch.zeros(1, 1, 28, 28), torch.zeros(1)), {"input_ids": torch.zeros(1, 12), "y": torch.zeros(1)}):
        bar = BarCallback()
        bar.on_fit_start(Run(example))
        units.append(bar.unit)
    assert units == ["img/s", "samples/s"]


@pytest.mark.parametrize("recipe, ahead", [("lenet-scratch", "0"), ("lenet-mnist", "1")])
def test_a_nan_loss_stops_the_run_naming_epoch_and_batch(data_dir, capsys, recipe, ahead, monkeypatch):
    monkeypatch.setenv("DPTRAIN_RUN_AHEAD", ahead)          # "1": decided a step later, as on GPUs
    args = ["train", "--recipe", recipe, "--data-dir", data_dir, "--epochs", "1", "--max-batches", "20",
            "--eval-batches", "1", "--lr", "1e30"]
    assert main(args) == 1
    assert "the loss became NaN or infinite at epoch 1, batch" in capsys.readouterr().err
    assert main(args + ["--on-nan", "skip", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["skipped_batches"] >= 1


def test_tensorboard_scalars(data_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert main(["train", "--data-dir", data_dir, "--epochs", "2", "--max-batches", "2", "--eval-batches", "1",
                 "--tensorboard", str(tmp_path / "tb")]) == 0
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("test_acc")] == [1, 2]
    assert len(events.Scalars("train_loss")) == 2


def test_tensorboard_missing_is_a_clear_message(monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    assert main(["train", "--tensorboard", "/tmp/x"]) == 2
    assert "--tensorboard needs the tensorboard package: pip install tensorboard" in capsys.readouterr().err


def test_skipped_batches_are_counted_and_the_loss_covers_the_others(data_dir, capsys):
    """lr 1e30: batch 1 trains (loss ~2.3), then every loss is NaN and skipped; the epoch's
    train loss is batch 1's, not the sum divided by all 20 batches (0.115)."""
    assert main(["train", "--data-dir", data_dir, "--epochs", "1", "--max-batches", "20", "--eval-batches", "1",
                 "--lr", "1e30", "--on-nan", "skip", "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    row = result["history"][0]
    assert row["skipped"] == result["skipped_batches"] == 19
    assert 2.0 < row["train_loss"] < 2.6
    assert "19 of 20 batches skipped (loss not finite)" in out.err


def test_plot_without_matplotlib_is_found_before_training(monkeypatch, capsys, tmp_path):
    import builtins
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["train", "--plot", str(tmp_path / "p.png"), "--data-dir", str(tmp_path)]) == 2   # no data needed
    assert "--plot needs matplotlib: pip install matplotlib" in capsys.readouterr().err


def test_a_full_disk_for_metrics_is_one_line(tmp_path):
    import os
    import subprocess
    from dptrain.outputs.metrics_file import MetricsLog
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        log = MetricsLog(disk / "m.jsonl")
        with pytest.raises(ValueError, match="could not write to the metrics file .*: No space left on device "
                                             r"\(the records before this epoch are kept\)"):
            for epoch in range(1000):
                log.append({"epoch": epoch, "train_loss": 1.0, "padding": "x" * 200})
    finally:
        subprocess.run(["umount", str(disk)], check=False)


class _Steps(dptrain.Callback):
    """Keeps each epoch's way (``run.plain_epoch``); ``watched``: every step the watched way."""

    def __init__(self, watched=False):
        self.watched, self.plain = watched, []

    def on_fit_start(self, run):
        run.plain_steps = not self.watched

    def on_epoch_end(self, run, epoch, row):
        self.plain.append(run.plain_epoch)


@pytest.mark.parametrize("settings, plain", [
    ({}, [True, True, True]),
    ({"max_steps": 7}, [True, True]),
    ({"on_nan": "skip", "clip_grad_norm": 0.5}, [True, True, True]),
    ({"devices": 2}, [False, True, True]),          # (the first step finds whether the model draws)
    ({"accumulate_grad_batches": 2, "checkpoint_every": 2}, [True, True, True]),
    ({"callbacks": [dptrain.callbacks.EarlyStopping(patience=5)]}, [True, True, True]),
    ({"callbacks": [dptrain.callbacks.EMA(decay=0.9)]}, [True, True, True]),     # (told after each step)
])
def test_plain_and_watched_steps_train_the_same_numbers(settings, plain, tmp_path):
    """The loop's plain way (nothing listening around a step) and its watched way train
    the same parameters to the same figures, bit for bit."""
    torch.manual_seed(0)
    X, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    results = []
    for watched in (False, True):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                    torch.nn.Linear(8, 3))
        steps = _Steps(watched)
        kwargs = {"devices": 1, **settings, "callbacks": settings.get("callbacks", []) + [steps]}
        if "checkpoint_every" in kwargs:
            kwargs["checkpoint_dir"] = str(tmp_path / f"ckpt{watched}")
        result = dptrain.fit(model, (X, y), (X, y), optimizer="adam", lr=0.01, epochs=3, batch_size=8, log=None,
                             progress=False, **kwargs)
        results.append((result["history"], model.state_dict(), steps.plain))
    (history, state, ways), (watched_history, watched_state, watched_ways) = results
    assert ways == plain and watched_ways == [False] * len(plain)
    assert [(r["train_loss"], r["test_loss"]) for r in history] == \
        [(r["train_loss"], r["test_loss"]) for r in watched_history]
    assert all(torch.equal(state[k], watched_state[k]) for k in state)


def test_a_callback_before_each_batch_takes_the_watched_way():
    class Count(dptrain.Callback):
        batches = 0

        def on_batch_start(self, run, epoch, batch):
            Count.batches += 1
    steps = _Steps()
    dptrain.fit(torch.nn.Linear(4, 2), (torch.randn(16, 4), torch.randint(0, 2, (16,))), epochs=2, batch_size=4,
                devices=1, log=None, progress=False, callbacks=[Count(), steps])
    assert steps.plain == [False, False] and Count.batches == 8
