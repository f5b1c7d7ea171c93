"""dptrain's outputs as callbacks: a figure a user's callback adds to an epoch's row (as a
Keras callback adds to ``logs``) is in the epoch line, the history, the metrics file,
TensorBoard and a resumed run's history; what no file can hold is an error naming it."""
import importlib.util
import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks.outputs import plain


class WeightNorm(dptrain.Callback):
    """The model's weight norm, as a tensor, and a NumPy number, added to every row."""

    def on_epoch_end(self, run, epoch, row):
        row["weight_norm"] = torch.linalg.vector_norm(torch.cat([p.detach().flatten()
                                                                 for p in run.model.parameters()]))
        row["half_epoch"] = np.float32(epoch / 2)


def data(n=64):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)


def train(epochs=2, callbacks=(), **kw):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    result = dptrain.fit(model, data(), data(32), epochs=epochs, batch_size=16, devices=1, optimizer="sgd", lr=0.1,
                         callbacks=list(callbacks), **kw)
    return model, result


def test_a_figure_a_callback_adds_to_the_row_is_in_every_output(tmp_path):
    lines = []
    model, result = train(callbacks=[WeightNorm()], metrics_file=str(tmp_path / "m.jsonl"), log=lines.append,
                          tensorboard=str(tmp_path / "tb") if _has_tensorboard() else None)
    norm = float(torch.linalg.vector_norm(torch.cat([p.detach().flatten() for p in model.parameters()])))
    last = result["history"][-1]
    assert type(last["weight_norm"]) is float and last["weight_norm"] == pytest.approx(norm)
    assert [h["half_epoch"] for h in result["history"]] == [0.5, 1.0]
    assert sum("weight norm" in line and "half epoch 1.000" in line for line in lines) == 1
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["half_epoch"] for r in records] == [0.5, 1.0] and records[-1]["weight_norm"] == last["weight_norm"]
    if _has_tensorboard():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        events = EventAccumulator(str(tmp_path / "tb"))
        events.Reload()
        assert [e.value for e in events.Scalars("half_epoch")] == [0.5, 1.0]
        assert "weight_norm" in events.Tags()["scalars"] and "epoch" not in events.Tags()["scalars"]


def test_a_resumed_run_keeps_the_figures_of_the_epochs_before(tmp_path):
    train(epochs=1, callbacks=[WeightNorm()], checkpoint_dir=str(tmp_path), log=None)
    _, result = train(epochs=2, callbacks=[WeightNorm()], checkpoint_dir=str(tmp_path), resume=True, log=None)
    assert [h["half_epoch"] for h in result["history"]] == [0.5, 1.0]


def test_what_no_file_can_hold_is_an_error_naming_it():
    assert plain("a", torch.tensor([1.0, 2.0])) == [1.0, 2.0] and plain("b", np.arange(2)) == [0, 1]
    assert plain("c", torch.tensor(3)) == 3 and plain("d", {"x": [1]}) == {"x": [1]}

    class Adds(dptrain.Callback):
        def on_epoch_end(self, run, epoch, row):
            row["model"] = run.model
    with pytest.raises(TypeError, match=r"the epoch row's 'model' is a Linear.*give a number"):
        train(callbacks=[Adds()], log=None)


def _has_tensorboard():
    return importlib.util.find_spec("tensorboard") is not None


class StepFigures(dptrain.Callback):
    """The largest weight, as a tensor, and a NumPy count, added to every step row."""

    def __init__(self):
        self.largest = []

    def on_train_log(self, run, row):
        row["max_weight"] = max(p.detach().abs().max() for p in run.model.parameters())
        row["rows_seen"] = np.int64(len(self.largest) + 1)
        self.largest.append(float(row["max_weight"]))


def test_a_figure_a_callback_adds_to_a_step_row_is_in_its_line_the_step_history_and_tensorboard(tmp_path):
    lines, figures = [], StepFigures()
    board = str(tmp_path / "tb") if _has_tensorboard() else None
    model, result = train(callbacks=[figures], log_every_n_steps=3, log=lines.append, tensorboard=board,
                          checkpoint_dir=str(tmp_path / "ck"))
    rows = result["step_history"]
    assert [r["step"] for r in rows] == [3, 6] and [r["rows_seen"] for r in rows] == [1, 2]
    assert [type(r["max_weight"]) for r in rows] == [float, float] and [r["max_weight"] for r in rows] == figures.largest
    assert any(line.startswith("step 6 ") and "max weight" in line and re.search(r"rows seen 2(,|$)", line) for line in lines)
    _, resumed = train(epochs=3, callbacks=[StepFigures()], log_every_n_steps=3, log=None, resume=True,
                       checkpoint_dir=str(tmp_path / "ck"))
    assert resumed["step_history"][:2] == rows         # the checkpoint kept them, plain
    if board:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        events = EventAccumulator(board)
        events.Reload()
        assert [e.value for e in events.Scalars("step/rows_seen")] == [1.0, 2.0]
        assert [e.step for e in events.Scalars("step/max_weight")] == [3, 6]
        assert "step/train_loss" in events.Tags()["scalars"] and "step/batch" not in events.Tags()["scalars"]

    class Adds(dptrain.Callback):
        def on_train_log(self, run, row):
            row["optimizer"] = run.optimizer
    with pytest.raises(TypeError, match=r"the step row's 'optimizer' is a"):
        train(callbacks=[Adds()], log_every_n_steps=2, log=None)
