"""``fit(log_every_n_steps=N)``: every N updates, the training loss over exactly those
updates (across epoch boundaries, devices and processes), the learning rate, and where."""
import functools
import json
import signal

import pytest
import torch
from torch import nn

import dptrain
from dptrain.cli.main import main
from dptrain.core.errors import Interrupted
from tests.run.test_step_limit import data


class PerStep(dptrain.Callback):
    """Each update's loss sum and denominator (one process: this process's are everyone's)."""

    def __init__(self):
        self.sums = []

    def on_batch_end(self, run, batch):
        self.sums.append(batch.result.numbers())


def train(devices=1, callbacks=(), **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    kw.setdefault("log", None)
    kw.setdefault("epochs", 2)
    return dptrain.fit(model, data(), data(60, seed=2), batch_size=20, devices=devices, log_every_n_steps=4,
                       optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                       scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5),
                       scheduler_interval="batch", callbacks=list(callbacks), **kw)


def test_each_row_is_the_loss_over_its_updates_across_epoch_boundaries():
    steps = PerStep()
    result = train(callbacks=[steps])                  # 10 updates an epoch: windows 1-4, 5-8, 9-12, ...
    rows = result["step_history"]
    assert [(r["step"], r["epoch"], r["batch"], r["steps"]) for r in rows] == \
        [(4, 1, 4, 4), (8, 1, 8, 4), (12, 2, 2, 4), (16, 2, 6, 4), (20, 2, 10, 4)]
    for r in rows:
        window = steps.sums[r["step"] - 4:r["step"]]
        assert r["train_loss"] == pytest.approx(sum(s for s, _ in window) / sum(c for _, c in window), rel=1e-12)
    assert [r["lr"] for r in rows] == [0.1 * 0.5 ** (s // 3) for s in (4, 8, 12, 16, 20)]   # after the step


@pytest.mark.parametrize("devices", [2, 3])
def test_rows_on_several_devices_equal_one_device(devices):
    want = train()["step_history"]
    got = train(devices)["step_history"]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert [r["train_loss"] for r in got] == pytest.approx([r["train_loss"] for r in want], rel=1e-5)


def plain_norms(clip, epochs=2):
    """The plain loop's ``clip_grad_norm_`` at every update (with fit's order of the samples)."""
    from dptrain.data.loader import TensorLoader
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    order, norms, each = TensorLoader(data(), 20, shuffle=True, seed=0), [], []
    for epoch in range(epochs):
        order.set_epoch(epoch)
        for X, y in order:
            opt.zero_grad()
            nn.functional.cross_entropy(model(X), y).backward()
            each.append({f"grad_norm/{name}": float(p.grad.norm()) for name, p in model.named_parameters()})
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip or float("inf"))))
            opt.step()
            sched.step()
    return model, norms, each


@pytest.mark.parametrize("devices", [1, 2, 3])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_log_grad_norm_gives_each_row_its_updates_norm_before_clipping_and_changes_no_step(devices, clip):
    """Hugging Face's ``grad_norm``: the norm clip_grad_norm_ returns, of the whole summed
    gradient; asking for it leaves the training as it was (nothing is clipped by it)."""
    plain, norms, _ = plain_norms(clip)
    result = train(devices, log_grad_norm=True, clip_grad_norm=clip)
    assert [r["grad_norm"] for r in result["step_history"]] == pytest.approx([norms[s - 1] for s in (4, 8, 12, 16, 20)],
                                                                              rel=1e-5)
    torch.manual_seed(0)
    without = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    again = train(devices, clip_grad_norm=clip)
    assert [r["train_loss"] for r in again["step_history"]] == [r["train_loss"] for r in result["step_history"]]
    with pytest.raises(ValueError, match="log_grad_norm goes with log_every_n_steps=N"):
        dptrain.fit(without, data(), log_grad_norm=True, epochs=1, log=None)


@pytest.mark.parametrize("devices,kvstore", [(1, "device"), (2, "device"), (3, "device"), (2, "local"),
                                             (2, "ring")])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_log_grad_norm_parameters_gives_each_parameters_norm_before_clipping(devices, kvstore, clip):
    """Lightning's ``grad_norm(module)``: each parameter's part of the summed gradient, by
    name, in the rows (not the lines), whatever the devices and the way they sum."""
    _, totals, each = plain_norms(clip)
    lines = []
    result = train(devices, log_grad_norm="parameters", clip_grad_norm=clip, kvstore=kvstore, log=lines.append)
    rows = result["step_history"]
    for row, step in zip(rows, (4, 8, 12, 16, 20)):
        mine = {k: v for k, v in row.items() if k.startswith("grad_norm/")}
        assert list(mine) == list(each[step - 1])           # the model's order
        assert mine == pytest.approx(each[step - 1], rel=1e-5)
        assert row["grad_norm"] == pytest.approx(totals[step - 1], rel=1e-5)
        assert sum(v * v for v in mine.values()) == pytest.approx(row["grad_norm"] ** 2, rel=1e-5)
    assert len(rows) == 5 and not any("grad_norm/" in line for line in lines)
    assert any("grad norm " in line for line in lines)


def test_a_frozen_layer_has_no_norm_and_an_unfrozen_one_gets_its_own():
    """Only what trains has a norm: a layer unfrozen by a callback joins from that update."""
    class Unfreeze(dptrain.Callback):
        def on_batch_start(self, run, epoch, batch):
            if run.step == 6:
                run.model[0].requires_grad_(True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    model[0].requires_grad_(False)
    rows = dptrain.fit(model, data(), batch_size=20, devices=2, epochs=1, log_every_n_steps=4, log=None,
                       optimizer=torch.optim.SGD(model.parameters(), lr=0.1), log_grad_norm="parameters",
                       callbacks=[Unfreeze()])["step_history"]
    assert [sorted(k for k in r if k.startswith("grad_norm/")) for r in rows] == [
        ["grad_norm/2.bias", "grad_norm/2.weight"],
        ["grad_norm/0.bias", "grad_norm/0.weight", "grad_norm/2.bias", "grad_norm/2.weight"]]


def test_a_bad_log_grad_norm_names_the_choices():
    with pytest.raises(ValueError, match="unknown log_grad_norm 'layers'; choose one of False, True, parameters"):
        dptrain.fit(nn.Linear(8, 3), data(), log_every_n_steps=2, log_grad_norm="layers", log=None)


def test_the_lines_and_the_callbacks_get_each_row():
    lines, seen = [], []

    class Seen(dptrain.Callback):
        def on_train_log(self, run, row):
            seen.append(row)
    result = train(callbacks=[Seen()], log=lines.append, epochs=1)
    assert seen == result["step_history"] and len(seen) == 2
    assert "step 4 (epoch 1, batch 4), train loss " in "\n".join(lines)
    assert sum(line.startswith("step ") for line in lines) == 2


class CtrlC(dptrain.Callback):
    def __init__(self, step):
        self.step = step

    def on_batch_end(self, run, batch):
        if batch.step == self.step:
            signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("step,devices", [(6, 1), (10, 1), (6, 2)])
def test_a_resumed_run_gives_the_unbroken_runs_rows(tmp_path, step, devices):
    """The checkpoint keeps the open window's loss sums: cut mid-window (update 6 of the
    window 5-8), at an epoch's end (update 10, window 9-12), or resumed on 2 devices."""
    want = train(log_grad_norm=True)["step_history"]
    with pytest.raises(Interrupted):
        train(callbacks=[CtrlC(step)], checkpoint_dir=str(tmp_path), log_grad_norm=True)
    rows = train(devices, checkpoint_dir=str(tmp_path), resume=True, log_grad_norm=True)["step_history"]
    assert [sorted(r) for r in rows] == [sorted(r) for r in want]
    for row, want_row in zip(rows, want):
        assert row == pytest.approx(want_row, rel=1e-6)


def test_a_checkpoint_without_the_open_window_says_what_the_first_row_covers(tmp_path):
    """(Checkpoints of older versions): the first row covers the updates since the checkpoint."""
    from dptrain.outputs.checkpoint import load_checkpoint, save_checkpoint
    want = train()["step_history"]
    with pytest.raises(Interrupted):
        train(callbacks=[CtrlC(6)], checkpoint_dir=str(tmp_path))
    state = load_checkpoint(tmp_path)
    del state["step_window"]
    save_checkpoint(tmp_path, state)
    rows = train(checkpoint_dir=str(tmp_path), resume=True)["step_history"]
    assert rows[0] == pytest.approx(want[0])                            # from the checkpoint
    assert (rows[1]["step"], rows[1]["steps"]) == (8, 2)                  # updates 7 and 8
    assert len(rows) == len(want)
    for row, want_row in zip(rows[2:], want[2:]):
        assert row == pytest.approx(want_row)


def test_tensorboard_gets_the_rows_at_their_steps(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    result = train(tensorboard=str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("step/train_loss")] == [4, 8, 12, 16, 20]
    assert [e.value for e in events.Scalars("step/train_loss")] == \
        pytest.approx([r["train_loss"] for r in result["step_history"]], rel=1e-6)
    assert len(events.Scalars("step/lr")) == 5


def test_the_command_line_takes_log_every_n_steps(capsys):
    main(["train", "--model", "tests.tasks.user_task:Net", "--data", "tests/tasks/user_task.py:data",
          "--log-every-n-steps", "2", "--max-steps", "4", "--batch-size", "32", "--devices", "1", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in result["step_history"]] == [2, 4]


def test_evaluations_every_n_steps_join_the_rows_and_leave_the_loss_windows_alone():
    steps = PerStep()
    seen = []

    class Evaluate(dptrain.Callback):       # the model as the row's evaluation saw it, scored by dptrain.evaluate
        def on_train_log(self, run, row):
            if "test_loss" in row:
                seen.append(dptrain.evaluate(run.model, data(60, seed=2), devices=1))
    result = train(callbacks=[steps, Evaluate()], eval_every_n_steps=5)
    rows = result["step_history"]
    assert [(r["step"], "train_loss" in r, "test_loss" in r) for r in rows] == [
        (4, True, False), (5, False, True), (8, True, False), (10, False, True), (12, True, False), (15, False, True),
        (16, True, False), (20, True, True)]
    for r in rows:
        if "train_loss" in r:
            window = steps.sums[r["step"] - 4:r["step"]]
            assert r["steps"] == 4 and r["train_loss"] == pytest.approx(sum(s for s, _ in window) /
                                                                         sum(c for _, c in window), rel=1e-12)
    tested = [r for r in rows if "test_loss" in r]
    for r, want in zip(tested, seen):
        assert r["test_loss"] == pytest.approx(want["test_loss"], rel=1e-6) and r["test_acc"] == want["test_acc"]
    # At an epoch's last step the model is the one the epoch's evaluation scores.
    assert tested[1]["test_loss"] == pytest.approx(result["history"][0]["test_loss"], rel=1e-12)
    assert tested[-1]["test_acc"] == result["history"][-1]["test_acc"]


def test_evaluations_every_n_steps_on_two_devices_equal_one_device():
    want = [r for r in train(eval_every_n_steps=3)["step_history"] if "test_loss" in r]
    got = [r for r in train(2, eval_every_n_steps=3)["step_history"] if "test_loss" in r]
    assert [r["step"] for r in got] == [r["step"] for r in want] == [3, 6, 9, 12, 15, 18]
    assert [r["test_loss"] for r in got] == pytest.approx([r["test_loss"] for r in want], rel=1e-5)


def test_evaluations_every_n_steps_need_an_evaluation_set():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="eval_every_n_steps needs an evaluation set"):
        dptrain.fit(nn.Linear(8, 3), data(), epochs=1, batch_size=20, eval_every_n_steps=2, log=None)


def test_a_skipped_batch_is_not_in_its_windows_loss():
    X, y = data()
    X[45] = float("nan")                       # in batch 3 of epoch 1 or another: wherever the order puts it
    steps = PerStep()
    torch.manual_seed(0)
    result = dptrain.fit(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), (X, y), epochs=1,
                         batch_size=20, log_every_n_steps=5, on_nan="skip", callbacks=[steps], log=None)
    assert result["history"][0]["skipped"] == 1
    for row in result["step_history"]:
        window = [(s, c) for s, c in steps.sums[row["step"] - 5:row["step"]] if s == s]   # the NaN one left out
        assert row["train_loss"] == pytest.approx(sum(s for s, _ in window) / sum(c for _, c in window), rel=1e-12)


def test_a_plateau_scheduler_stepped_every_batch_decides_on_each_step_evaluation():
    plateau = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=0, factor=0.5)

    def train(**kw):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        return dptrain.fit(model, data(), data(60, seed=2), batch_size=20, devices=1, log=None, epochs=3,
                           optimizer=functools.partial(torch.optim.SGD, lr=2.0),   # too large: the test loss wanders
                           scheduler=plateau, scheduler_interval="batch", **kw)
    result = train(eval_every_n_steps=3)
    rows = result["step_history"]
    assert [r["step"] for r in rows] == list(range(3, 31, 3))
    # What a ReduceLROnPlateau given those test losses in turn does (the row's lr: after the step).
    mirror = torch.optim.lr_scheduler.ReduceLROnPlateau(torch.optim.SGD([torch.zeros(1)], lr=2.0), patience=0,
                                                        factor=0.5)
    want = []
    for r in rows:
        mirror.step(r["test_loss"])
        want.append(mirror.optimizer.param_groups[0]["lr"])
    assert [r["lr"] for r in rows] == want and len(set(want)) > 1
    with pytest.raises(ValueError, match="ReduceLROnPlateau stepped every batch has no figure to decide on"):
        train()


class CountedReads(torch.utils.data.Dataset):
    """``data(60, seed=2)`` as a Dataset that counts its reads."""

    def __init__(self):
        self.X, self.y = data(60, seed=2)
        self.reads = 0

    def __len__(self):
        return 60

    def __getitem__(self, i):
        self.reads += 1
        return self.X[i], self.y[i]


@pytest.mark.parametrize("ema", [False, True])
def test_an_epoch_evaluated_at_a_step_evaluation_reuses_it_unless_a_callback_loads_other_weights(ema):
    from dptrain.callbacks import EMA
    evals = CountedReads()

    class FromTheStart(dptrain.Callback):       # (not the sample read before training to try the model)
        def on_fit_start(self, run):
            evals.reads = 0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    result = dptrain.fit(model, data(), evals, batch_size=20, devices=1, log=None, epochs=2, eval_every_n_steps=5,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                         callbacks=[FromTheStart()] + ([EMA(0.5, evaluate=True)] if ema else []))
    # 10 updates an epoch: evaluated at steps 5, 10 (the epoch's end), 15, 20; the epochs' own
    # evaluations only for EMA's average
    assert evals.reads == 60 * (4 + 2 * ema)
    by_step = {r["step"]: r for r in result["step_history"]}
    for row in result["history"]:
        same = by_step[row["epoch"] * 10]["test_loss"] == row["test_loss"]
        assert same != ema
