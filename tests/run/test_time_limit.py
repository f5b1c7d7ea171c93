"""``fit(max_time=...)``: the run ends when its time is up, after the batch where the clock
passed it (mid-epoch: that epoch evaluated and saved), and a resumed run ends as the unbroken
one. The clock is replaced here, so the test decides where the time runs out."""
import datetime
import functools
import os
import time

import pytest
import torch
from torch import nn

import dptrain
from dptrain.cli.args import build_parser
from dptrain.distributed import env
from dptrain.run import time_limit
from dptrain.run.config import TrainConfig
from tests.run.test_step_limit import Count, data


class Clock:
    """A clock that stands still until a callback moves it."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class PassTheTime(dptrain.Callback):
    """Moves the clock past any limit after ``batch`` of ``epoch`` (batch 0: at the epoch's
    end), on every process or on ``rank`` only."""

    def __init__(self, clock, epoch, batch, rank=None):
        self.clock, self.epoch, self.batch, self.rank = clock, epoch, batch, rank

    def on_batch_end(self, run, batch):
        if (batch.epoch, batch.batch) == (self.epoch, self.batch) and self.rank in (None, run.rank):
            self.clock.t += 1e6

    def on_epoch_end(self, run, epoch, row):
        if (epoch, 0) == (self.epoch, self.batch) and self.rank in (None, run.rank):
            self.clock.t += 1e6


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time_limit, "now", clock)
    return clock


def train(devices=1, callbacks=(), **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    kw.setdefault("log", None)
    result = dptrain.fit(model, data(), data(60, seed=2), batch_size=20, devices=devices, epochs=3,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                         callbacks=list(callbacks), **kw)
    return model, result


def same_history(a, b):
    drop = lambda rows: [{k: v for k, v in r.items() if k not in ("sec", "images_per_sec")} for r in rows]  # noqa: E731
    return drop(a["history"]) == drop(b["history"])


def test_a_length_of_time_is_seconds_a_timedelta_a_dict_or_a_clock_time():
    for value, seconds in ((90, 90.0), (2.5, 2.5), ("01:30:00", 5400.0), ("1:00:00:30", 86430.0),
                           (datetime.timedelta(minutes=2), 120.0), ({"hours": 11}, 39600.0)):
        assert TrainConfig(max_time=value).max_time == seconds
    for bad in ("1:30", "soon", 0, -5, True, float("inf")):
        with pytest.raises(ValueError, match="max-time must be a length of time"):
            TrainConfig(max_time=bad)
    assert build_parser().parse_args(["train", "--max-time", "0:45:00"]).max_time == 2700.0
    assert build_parser().parse_args(["train", "--max-time", "30"]).max_time == 30.0
    assert time_limit.said(3725) == "1:02:05" and time_limit.said(2.5) == "2.5 s"


@pytest.mark.parametrize("devices", [1, 2])
def test_time_up_mid_epoch_ends_after_that_batch_and_a_resumed_run_ends_as_the_unbroken_one(tmp_path, clock,
                                                                                          devices):
    whole_count = Count()
    whole, whole_result = train(devices, [whole_count])
    assert "timed_out" not in whole_result
    lines, part_count = [], Count()
    part, cut = train(devices, [part_count, PassTheTime(clock, 2, 3)], max_time="01:00:00",
                      checkpoint_dir=str(tmp_path), log=lines.append)
    # The clock passed during batch 3 of epoch 2, so the run ended after it: that epoch is
    # evaluated and its row says what it trained.
    assert cut["timed_out"] and part_count.updates == 13 and [h["epoch"] for h in cut["history"]] == [1, 2]
    assert cut["history"][-1]["batches"] == 3 and "test_loss" in cut["history"][-1]
    assert any("3 of 10 batches (max_time)" in line for line in lines)
    assert any("stopped after epoch 2: max_time 1:00:00 reached at batch 3 of 10" in line for line in lines)
    lines, resumed_count = [], Count()
    clock.t = 0.0
    resumed, result = train(devices, [resumed_count], max_time=3600, checkpoint_dir=str(tmp_path), resume=True,
                            log=lines.append)
    assert any("epoch 2 ended after batch 3 (max_time); it goes on from there" in line for line in lines)
    assert result["timed_out"] is False
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    assert same_history(result, whole_result)
    assert (resumed_count.updates, resumed_count.ends) == (whole_count.updates, whole_count.ends) == (30, 3)


def test_time_up_at_an_epochs_end_stops_there_and_a_resumed_run_goes_on_with_the_next(tmp_path, clock):
    whole, whole_result = train()
    lines = []
    part, cut = train(callbacks=[PassTheTime(clock, 1, 0)], max_time=60, checkpoint_dir=str(tmp_path),
                      log=lines.append)
    assert cut["timed_out"] and len(cut["history"]) == 1 and "batches" not in cut["history"][0]
    assert any("stopped after epoch 1: max_time 0:01:00 reached after epoch 1" in line for line in lines)
    resumed, result = train(max_time=60, checkpoint_dir=str(tmp_path), resume=True)
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    assert same_history(result, whole_result)


def test_time_up_in_the_last_epoch_ends_the_run_as_usual(clock):
    model, result = train(callbacks=[PassTheTime(clock, 3, 0)], max_time=60)
    assert len(result["history"]) == 3 and not result["timed_out"]      # it trained what it was to train
    model, result = train(callbacks=[PassTheTime(clock, 1, 10)], max_time=60)    # the epoch's last batch
    assert [h.get("batches") for h in result["history"]] == [None]      # a whole epoch: no cut


def test_a_job_started_before_the_run_counts_its_time_so_restarted_workers_share_one_limit(clock, monkeypatch):
    # The job (a launcher, or the job script) began 100 s before this worker: a 50 s limit is
    # up after the first batch, not 50 s after the worker started.
    monkeypatch.setenv(env.JOB_START, f"{time.time() - 100:.3f}")
    lines, count = [], Count()
    model, result = train(callbacks=[count], max_time=50, log=lines.append)
    assert result["timed_out"] and count.updates == 1
    assert any("max_time 50 s reached at batch 1 of 10" in line for line in lines)
    assert any(line.startswith("dptrain: max_time 50 s counts from the job's start (DPTRAIN_JOB_START), 0:01:40 ago: 0 s left")
               for line in lines), lines
    monkeypatch.setenv(env.JOB_START, f"{time.time() - 10:.3f}")     # 10 s of 50 gone: the run is whole
    assert not train(max_time=50)[1]["timed_out"]
    monkeypatch.setenv(env.JOB_START, "yesterday")
    with pytest.raises(ValueError, match="DPTRAIN_JOB_START must be the job's start in seconds since the epoch"):
        train(max_time=50)
    train()                     # without max_time the variable is not read


def test_the_launcher_marks_the_jobs_start_once(monkeypatch):
    monkeypatch.delenv(env.JOB_START, raising=False)
    before = time.time()
    env.mark_job_start()
    started = float(os.environ[env.JOB_START])
    assert before - 0.01 <= started <= time.time() + 0.01
    monkeypatch.setenv(env.JOB_START, "1000.5")         # set by the job script: kept
    env.mark_job_start()
    assert os.environ[env.JOB_START] == "1000.5"
