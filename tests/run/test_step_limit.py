"""``fit(max_steps=N)``: the run ends after N updates, mid-epoch if there; that epoch is
evaluated and saved, and a resumed run with a larger limit ends as one given it at once."""
import functools
import json

import pytest
import torch
from torch import nn

import dptrain
from dptrain.cli.main import main
from dptrain.run.step_limit import StepLimit, epochs_for, steps_done
from dptrain.run.resume import Position


def data(n=200, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 8, generator=g)
    return X, torch.randint(0, 3, (n,), generator=g)


class Count(dptrain.Callback):
    """Counts the updates and the epoch ends it has seen (its state is checkpointed)."""

    def __init__(self):
        self.updates, self.ends = 0, 0

    def on_batch_end(self, run, batch):
        self.updates += 1

    def on_epoch_end(self, run, epoch, row):
        self.ends += 1

    def state_dict(self):
        return {"updates": self.updates, "ends": self.ends}

    def load_state_dict(self, state):
        self.updates, self.ends = state["updates"], state["ends"]


def train(devices=1, count=None, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    kw.setdefault("log", None)
    result = dptrain.fit(model, data(), data(60, seed=2), batch_size=20, devices=devices,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                         callbacks=[count] if count is not None else [], **kw)
    return model, result


def test_the_arithmetic_of_the_limit():
    assert [epochs_for(n, 10) for n in (1, 10, 11, 25)] == [1, 1, 2, 3]
    assert epochs_for(25, None) == 25           # an open-ended stream's epochs: a bound (a batch each at least)
    limit = StepLimit(25)
    assert [limit.last_batch(before, 10) for before in (0, 10, 20, 30)] == [10, 10, 5, 0]
    assert limit.last_batch(20, None) == 5 and StepLimit(None).last_batch(20, None) > 10**9
    assert [steps_done(p, 10) for p in (Position(3, 4), Position(3, 5), Position(4))] == [24, 25, 30]
    assert steps_done(Position(3, 4), None, saved=17) == 17     # (open-ended: the checkpoint's count)
    assert not limit.reached(24) and limit.reached(25) and limit.reached(30)
    assert StepLimit(None).last_batch(70, 10) == 10 and not StepLimit(None).reached(10**6)
    assert limit.reason(5, 10) == "max_steps 25 reached at batch 5 of 10"
    assert limit.reason(5, None) == "max_steps 25 reached at batch 5"
    # What a run has left at most: (updates, epoch ends), from its step and epoch.
    assert StepLimit(None).left(0, 1, 4, 10) == (40, 4) and StepLimit(None).left(24, 3, 4, 10) == (16, 2)
    assert limit.left(0, 1, 9, 10) == (25, 3) and limit.left(24, 3, 9, 10) == (1, 1)
    assert limit.left(5, 2, 25, None) == (20, 24) and StepLimit(None).left(5, 2, 4, None) == (None, 3)


@pytest.mark.parametrize("devices", [1, 2])
def test_the_run_ends_after_max_steps_updates_mid_epoch_with_that_epoch_evaluated(devices):
    count = Count()
    lines = []
    _, result = train(devices, count, max_steps=25, log=lines.append)      # 10 batches an epoch
    assert count.updates == 25 and result["epochs"] == 3
    rows = result["history"]
    assert [r["epoch"] for r in rows] == [1, 2, 3] and "batches" not in rows[1]
    assert rows[2]["batches"] == 5 and rows[2]["samples"] == 100 and "test_acc" in rows[2]
    assert result["test_acc"] == rows[2]["test_acc"]
    assert any("max_steps 25 reached at batch 5 of 10" in line for line in lines)
    assert any(line.startswith("epoch 3,") and "5 of 10 batches (max_steps)" in line for line in lines)
    # The speed counts the samples trained: 2.5 epochs' worth.
    assert result["sec_per_epoch"] == pytest.approx(sum(r["sec"] for r in rows) / 2.5)


def test_the_first_of_epochs_and_max_steps_ends_the_run():
    count = Count()
    _, result = train(count=count, epochs=2, max_steps=25)
    assert count.updates == 20 and len(result["history"]) == 2 and "batches" not in result["history"][-1]
    count, lines = Count(), []
    _, result = train(count=count, epochs=5, max_steps=20, log=lines.append)   # at an epoch's end
    assert count.updates == 20 and len(result["history"]) == 2 and "batches" not in result["history"][-1]
    assert any("stopped after epoch 2: max_steps 20 reached at batch 10 of 10" in line for line in lines)


def test_max_steps_counts_updates_with_accumulation():
    count = Count()
    _, result = train(count=count, max_steps=7, accumulate_grad_batches=2)     # 5 updates an epoch
    assert count.updates == 7 and result["history"][-1]["batches"] == 2
    assert result["history"][-1]["samples"] == 80                               # 2 updates of 2 x 20


@pytest.mark.parametrize("devices", [1, 2])
def test_a_run_resumed_with_a_larger_max_steps_ends_as_one_given_it_at_once(tmp_path, devices):
    whole_count = Count()
    whole, whole_result = train(devices, whole_count, max_steps=27, metrics_file=str(tmp_path / "whole.jsonl"))
    part_count = Count()
    train(devices, part_count, max_steps=13, checkpoint_dir=str(tmp_path / "run"),
          metrics_file=str(tmp_path / "part.jsonl"))
    assert part_count.updates == 13
    lines = []
    resumed_count = Count()
    resumed, result = train(devices, resumed_count, max_steps=27, checkpoint_dir=str(tmp_path / "run"),
                            metrics_file=str(tmp_path / "part.jsonl"), resume=True, log=lines.append)
    assert any("epoch 2 ended after batch 3 (max_steps); it goes on from there" in line for line in lines)
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    drop = lambda rows: [{k: v for k, v in r.items() if k not in ("sec", "images_per_sec")} for r in rows]  # noqa: E731
    assert drop(result["history"]) == drop(whole_result["history"])
    # The callbacks go on from their state when the limit was reached (the cut epoch's end not counted).
    assert (resumed_count.updates, resumed_count.ends) == (whole_count.updates, whole_count.ends) == (27, 3)
    records = [json.loads(line) for line in (tmp_path / "part.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3] and records[-1]["batches"] == 7


def test_a_run_resumed_with_the_same_max_steps_has_nothing_left_to_do(tmp_path):
    count = Count()
    model, first = train(count=count, max_steps=13, checkpoint_dir=str(tmp_path))
    again = Count()
    model2, second = train(count=again, max_steps=13, checkpoint_dir=str(tmp_path), resume=True)
    assert again.updates == 13 and again.ends == 2          # the checkpoint's state; no batch trained
    assert second["history"] == first["history"]
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)


def test_bad_max_steps_is_an_error_naming_it():
    with pytest.raises(ValueError, match="max_steps must be a whole number >= 1, got 0"):
        train(max_steps=0)


def test_the_command_line_takes_max_steps(capsys):
    main(["train", "--model", "tests.tasks.user_task:Net", "--data", "tests/tasks/user_task.py:data",
          "--max-steps", "3", "--batch-size", "32", "--devices", "1", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["history"][-1]["batches"] == 3 and len(result["history"]) == 1


def test_an_epoch_max_steps_ends_is_evaluated_whatever_eval_every_and_scores_its_batches():
    _, result = train(max_steps=15, eval_every=3, train_metrics=True, epochs=4)
    rows = result["history"]
    assert len(rows) == 2 and "test_acc" not in rows[0] and "test_acc" in rows[1]     # evaluated: the run ends there
    assert rows[1]["batches"] == 5 and 0.0 <= rows[1]["train_acc"] <= 1.0
