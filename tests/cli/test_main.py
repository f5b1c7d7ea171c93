"""The command line as users run it: output, --json, one-line errors and exit codes."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from dptrain.cli.main import main
from tests.warm import dptrain_cli


def dptrain(*args, env=None, timeout=300, interpreter=False):
    """The command in a process of its own: forked warm (``tests/warm.py``), or with
    ``interpreter=True`` a fresh ``python -m dptrain.cli`` (start-up included)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "2", **(env or {})}
    if not interpreter:
        return dptrain_cli(list(args), env=full_env, timeout=timeout)
    return subprocess.run([sys.executable, "-m", "dptrain.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def test_quick_run_prints_epochs_and_the_closing_line(data_dir):
    out = dptrain("train", "--data-dir", data_dir, "--epochs", "2", "--max-batches", "3", interpreter=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("epoch 1, ") and "train loss" in lines[0] and "test acc" in lines[0]
    assert lines[1].startswith("epoch 2, ")
    # devices auto on a CPU: one device or both virtual ones, whichever a few steps found faster, said
    chosen = [line for line in out.stderr.splitlines() if line.startswith("dptrain: devices auto: ")]
    assert len(chosen) == 1 and "ms on one device" in chosen[0], out.stderr
    on = "[cpu:0]" if chosen[0].startswith("dptrain: devices auto: cpu:0:") else "[cpu:0, cpu:1]"
    assert lines[-1].startswith("test acc: ") and lines[-1].endswith(f"sec/epoch on {on}")


def test_json_result(data_dir, capsys):
    assert main(["train", "--data-dir", data_dir, "--devices", "cpu:0,cpu:1,cpu:2", "--epochs", "1",
                 "--max-batches", "2", "--batch-size", "60", "--lr", "0.1", "--allreduce", "ring",
                 "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["recipe"] == "lenet-scratch"
    assert result["devices"] == ["cpu:0", "cpu:1", "cpu:2"]
    assert (result["epochs"], result["batch_size"], result["lr"]) == (1, 60, 0.1)
    assert 0.0 <= result["test_acc"] <= 1.0 and result["images_per_sec"] > 0 and result["sec_per_epoch"] > 0
    assert [set(h) for h in result["history"]] == [{"epoch", "sec", "train_loss", "test_loss", "test_acc"}]
    assert result["kvstore"] == "ring"
    assert "epoch 1" in captured.err          # progress goes to stderr with --json


def test_train_metrics_adds_the_training_figures_to_rows_lines_and_result(data_dir, capsys):
    assert main(["train", "--data-dir", data_dir, "--devices", "2", "--epochs", "1", "--max-batches", "2",
                 "--train-metrics", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert [list(h) for h in result["history"]] == [["epoch", "sec", "train_loss", "train_acc", "test_loss",
                                                     "test_acc"]]
    assert 0.0 <= result["train_acc"] <= 1.0 and result["train_acc"] == result["history"][0]["train_acc"]
    assert f"train acc {result['train_acc']:.3f}, test loss" in captured.err


@pytest.mark.slow
def test_lenet_scratch_learns_fashion_mnist(data_dir, capsys):
    """Two full epochs on 2 virtual devices. Seeds 0-2 reach 0.60-0.62 (chance: 0.10); the
    first epoch sits on the N(0, 0.01) plateau (loss 2.303) as the reference does."""
    assert main(["train", "--data-dir", data_dir, "--epochs", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test_acc"] > 0.5, result


@pytest.mark.slow
def test_lenet_mnist_learns_in_one_epoch(data_dir, capsys):
    """The Gluon tutorial recipe (Trainer, KVStore 'device', uneven splits on 3 devices):
    one epoch reaches 0.95 with seed 0; 0.9 leaves room for other machines' rounding."""
    assert main(["train", "--recipe", "lenet-mnist", "--data-dir", data_dir, "--epochs", "1",
                 "--devices", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test_acc"] > 0.9, result
    assert (result["batch_size"], result["lr"], result["optimizer"], result["kvstore"]) == (128, 0.04, "sgd", "device")


def test_resnet18_few_batches(data_dir, capsys):
    assert main(["train", "--recipe", "resnet18", "--data-dir", data_dir, "--epochs", "1", "--batch-size", "32",
                 "--max-batches", "2", "--eval-batches", "1", "--sync-bn", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["batch_size"], result["lr"], result["sync_batchnorm"]) == (32, 0.2, True)
    assert result["history"][0]["train_loss"] > 0


def test_resnet18_no_scale_keeps_the_batch(data_dir, capsys):
    assert main(["train", "--recipe", "resnet18", "--data-dir", data_dir, "--epochs", "1", "--batch-size", "8",
                 "--max-batches", "1", "--eval-batches", "1", "--no-scale", "--kvstore", "local",
                 "--optimizer", "adam", "--lr", "0.001", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["batch_size"], result["lr"], result["optimizer"], result["kvstore"]) == (8, 0.001, "adam", "local")


BAD_INPUT = [
    (["train", "--epochs", "0"], "argument --epochs: expected a whole number >= 1, got 0"),
    (["train", "--lr", "-1"], "argument --lr: expected a finite number > 0, got -1"),
    (["train", "--batch-size", "x"], "expected a whole number >= 1, got 'x'"),
    (["train", "--recipe", "vgg"], "unknown recipe 'vgg'; choose one of lenet-scratch, resnet18, lenet-mnist"),
    (["train", "--devices", "cuda:0"], "cuda:0 does not exist"),
    (["train", "--devices", "4", "--batch-size", "2"], "batch size 2 is smaller than the 4 devices"),
    (["train", "--allreduce", "tree"], "argument --allreduce: invalid choice: 'tree'"),
    (["train", "--optimizer", "sdg"], "unknown optimizer 'sdg'; choose one of sgd, nag, adam, adamw"),
    (["train", "--allreduce", "ring", "--kvstore", "local"], "--allreduce ring and --kvstore local both say"),
    (["train", "--recipe", "lenet-mnist", "--kvstore", "none"], "kvstore=None cannot sum gradients over 2 devices"),
    (["train", "--eval-batches", "0"], "argument --eval-batches: expected a whole number >= 1, got 0"),
]


def _one_error_line(code, out, err, message):
    assert code == 2
    assert out == ""
    lines = [line for line in err.splitlines() if not line.startswith("dptrain: no GPU")]
    assert len(lines) == 1 and lines[0].startswith("dptrain: error: ") and message in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    try:
        code = main(args)
    except SystemExit as e:             # (argparse's errors: the command's exit status)
        code = e.code
    _one_error_line(code, *capsys.readouterr(), message)


@pytest.mark.parametrize("args, message", [BAD_INPUT[0], BAD_INPUT[5]])
def test_bad_input_from_the_command_itself(args, message):
    """The same in a process of its own: a parse error and a run's error."""
    out = dptrain(*args)
    _one_error_line(out.returncode, out.stdout, out.stderr, message)


def test_missing_data_names_the_places_and_exits_1(tmp_path):
    out = dptrain("train", "--data-dir", str(tmp_path), env={
        "XDG_CACHE_HOME": str(tmp_path / "cache"), "DPTRAIN_MIRROR": "http://127.0.0.1:9/"})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert str(tmp_path) in out.stderr and "--data-dir" in out.stderr


def test_debug_shows_the_traceback():
    out = dptrain("train", "--devices", "cpu:0,cpu:9x", "--debug")
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_devices_command():
    out = dptrain("devices")
    assert out.returncode == 0
    rows = out.stdout.strip().splitlines()
    assert rows[0].startswith("cpu:0") and "virtual cpu" in rows[0] and "GiB" in rows[0]


def test_no_command_shows_help():
    out = dptrain()
    assert out.returncode == 2 and "train" in out.stdout


def test_your_model_and_data_by_name(capsys):
    """--model/--data/--loss/--optimizer take the user's code by import path."""
    assert main(["train", "--model", "tests.tasks.user_task:Net", "--data", "tests/tasks/user_task.py:data",
                 "--optimizer", "torch.optim:AdamW", "--lr", "0.01", "--epochs", "2", "--batch-size", "32",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recipe"] == "tests.tasks.user_task:Net" and result["optimizer"] == "AdamW"
    assert result["test_acc"] > 0.5 and set(result["history"][0]) >= {"train_loss", "test_loss", "test_acc"}
    assert main(["train", "--model", "tests.tasks.user_task:mlp", "--data", "tests.tasks.user_task:flat_data",
                 "--loss", "cross-entropy", "--epochs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["history"][0]["train_loss"] > 0


def test_keras_metrics_by_name_from_the_command_line_and_a_metrics_file_named_as_one(tmp_path, capsys,
                                                                                    monkeypatch):
    """``--metric accuracy,mae``: Keras's names, as fit's metrics=[...] (the command line had no
    way to them); ``--metrics mae``, the file flag given a metric's name, wrote a file "mae"."""
    monkeypatch.chdir(tmp_path)
    args = ["train", "--model", "tests.tasks.user_task:regressor", "--data", "tests.tasks.user_task:regression",
            "--loss", "mse", "--epochs", "2", "--devices", "2"]
    assert main(args + ["--metrics", "mae"]) == 2
    assert "'mae' is a metric's name: with --model, give --metric mae" in capsys.readouterr().err
    assert main(["train", "--metric", "mae"]) == 2
    assert "--metric goes with --model and --data" in capsys.readouterr().err
    assert main(args + ["--metric", "mae, mse", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["test_mse"] == pytest.approx(result["test_loss"], rel=1e-6) and 0 < result["test_mae"]
    assert not (tmp_path / "mae").exists()


def test_a_stream_from_the_command_line_counts_its_epochs_in_batches(capsys):
    args = ["train", "--model", "tests.tasks.user_task:mlp", "--data", "tests.tasks.user_task:stream_data",
            "--epochs", "2", "--batch-size", "32", "--devices", "2", "--json"]
    assert main(args + ["--max-steps", "4"]) == 0      # an endless pass: max_steps ends it
    out, err = capsys.readouterr()
    assert "EndlessPairs has no __len__: an epoch is a pass of it read to its end" in err
    assert [(row["epoch"], row["batches"]) for row in json.loads(out)["history"]] == [(1, 4)]
    assert main(args + ["--steps-per-epoch", "3", "--no-shuffle", "--log-every-n-steps", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["history"]) == 2 and [row["step"] for row in result["step_history"]] == [1, 2, 3, 4, 5, 6]
    assert [row["epoch"] for row in result["step_history"]] == [1, 1, 1, 2, 2, 2]


def test_validation_split_holds_out_the_last_samples_from_the_command_line(capsys):
    assert main(["train", "--model", "tests.tasks.user_task:Net", "--data", "tests.tasks.user_task:train_only",
                 "--validation-split", "0.25", "--epochs", "1", "--batch-size", "32", "--devices", "1",
                 "--json"]) == 0
    assert "test_acc" in json.loads(capsys.readouterr().out)["history"][0]
    assert main(["train", "--model", "tests.tasks.user_task:Net", "--data", "tests.tasks.user_task:data",
                 "--validation-split", "0.25", "--epochs", "1", "--devices", "1"]) == 2
    assert "both an evaluation set and validation_split were given" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--model", "tests.tasks.user_task:Net"], "--model and --data go together"),
    (["--model", "tests.tasks.user_task:Nope", "--data", "tests.tasks.user_task:data"],
     "has no 'Nope'"),
    (["--model", "no_such_pkg.mod:f", "--data", "tests.tasks.user_task:data"], "no module named 'no_such_pkg'"),
    (["--model", "tests.tasks.user_task:Net", "--data", "tests.tasks.user_task:data", "--loss", "hinge"],
     "unknown --loss 'hinge'"),
    (["--recipe", "tests/tasks/missing.py:make"], "no file tests/tasks/missing.py"),
    (["--recipe", "tests.tasks.user_task:data"], "returned tuple, not a dptrain.Task"),
])
def test_bad_user_code_names_are_one_line(args, message, capsys):
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_ctrl_c_with_no_message_says_interrupted(monkeypatch, capsys):
    """A KeyboardInterrupt without text (Ctrl-C outside the loop's own handler) printed an
    empty 'dptrain: ' line."""
    cli_main = importlib.import_module("dptrain.cli.main")

    def interrupted():
        raise KeyboardInterrupt()
    monkeypatch.setattr(cli_main, "_devices_command", interrupted)
    assert main(["devices"]) == 130
    assert capsys.readouterr().err.strip() == "dptrain: interrupted"


def test_lr_find_runs_the_range_test_then_trains_at_its_suggestion(capsys):
    assert main(["train", "--model", "tests.tasks.user_task:mlp", "--data", "tests.tasks.user_task:flat_data",
                 "--loss", "cross-entropy", "--epochs", "1", "--devices", "1", "--lr-find", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    line = next(line for line in err.splitlines() if line.startswith("dptrain: --lr-find: "))
    assert f"suggests lr {result['lr']:.3g}: training at it" in line and result["history"][0]["train_loss"] > 0
