"""``eval_every=N``: the evaluation set is scored after every N-th epoch, the last, and an
epoch a stop ended, only; callbacks and ``ReduceLROnPlateau`` pass over the others, as
Keras's ``validation_freq`` and Lightning's ``check_val_every_n_epoch`` do (``loop.py``)."""
import functools

import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks import BestCheckpoint, EarlyStopping

torch.set_num_threads(1)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    return X, (X[:, :2].sum(1) > 0).long()


class Evaluations(dptrain.Callback):
    def __init__(self):
        self.started, self.ended, self.flags = [], [], []

    def on_evaluate_start(self, run, epoch):
        self.started.append(epoch)

    def on_evaluate_end(self, run, epoch, metrics):
        self.ended.append(epoch)

    def on_epoch_end(self, run, epoch, row):
        self.flags.append(run.evaluated_epoch)


def fit(epochs=7, every=1, devices=2, callbacks=(), lr=0.2, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
    return dptrain.fit(model, data(96, 1), data(40, 2), loss=nn.CrossEntropyLoss(), lr=lr, epochs=epochs,
                       batch_size=16, devices=devices, eval_every=every, callbacks=list(callbacks), log=None, **kw)


def test_every_third_epoch_and_the_last_are_evaluated_with_the_figures_of_a_full_run():
    seen = Evaluations()
    every = fit(every=3, callbacks=[seen])["history"]
    full = fit()["history"]
    assert seen.started == seen.ended == [3, 6, 7]
    assert seen.flags == [e in (3, 6, 7) for e in range(1, 8)]
    for row, want in zip(every, full):
        assert row["train_loss"] == want["train_loss"]               # training is the same
        if row["epoch"] in (3, 6, 7):
            assert (row["test_loss"], row["test_acc"]) == (want["test_loss"], want["test_acc"])
        else:
            assert not [k for k in row if k.startswith("test_")], row
    with pytest.raises(ValueError, match="eval_every must be a whole number >= 1, got 0"):
        fit(every=0)


def test_early_stopping_and_best_checkpoint_count_only_the_evaluated_epochs(tmp_path):
    """patience=2 with eval_every=2 stops two evaluations after the best one, i.e. 4 epochs on."""
    stop, best = EarlyStopping("test_loss", patience=2), BestCheckpoint(str(tmp_path / "b.pt"), "test_acc")
    result = fit(epochs=40, every=2, callbacks=[stop, best], lr=0.0)        # lr 0: never better after epoch 2
    assert [r["epoch"] for r in result["history"]][-1] == 6 and stop.watch.best_epoch == 2
    assert best.best_epoch == 2
    with pytest.raises(ValueError, match="EarlyStopping monitors test_loss, a figure of the evaluation, but the run "
                                         "has no evaluation set"):
        dptrain.fit(nn.Linear(5, 2), data(32, 1), epochs=1, batch_size=16, devices=1, log=None,
                    callbacks=[EarlyStopping("test_loss")])           # no evaluation set at all: an error at the start


def test_reduce_lr_on_plateau_steps_on_the_evaluated_epochs_only():
    scheduler = []

    def plateau(optimizer):
        scheduler.append(torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0))
        return scheduler[-1]
    fit(epochs=6, every=2, scheduler=plateau, optimizer=functools.partial(torch.optim.SGD, lr=0.2))
    assert scheduler[-1].last_epoch == 3                        # epochs 2, 4, 6


def test_an_epoch_a_stop_ended_is_evaluated():
    class StopInEpoch2(dptrain.Callback):
        def on_batch_end(self, run, batch):
            if batch.epoch == 2 and batch.batch == 2:
                run.stop("enough")
    result = fit(epochs=9, every=5, callbacks=[StopInEpoch2()])
    assert [r["epoch"] for r in result["history"]] == [1, 2]
    assert "test_loss" not in result["history"][0] and "test_acc" in result["history"][1]
    assert result["test_acc"] == result["history"][1]["test_acc"]


def test_a_plateau_on_the_accuracy_steps_on_each_evaluated_epochs_accuracy():
    """scheduler_monitor="val_accuracy" with mode="max" on 2 devices: the learning rates are
    those of the same scheduler fed the evaluated epochs' test_acc by hand."""
    made = []

    def plateau(optimizer):
        made.append(torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5))
        return made[-1]
    result = fit(epochs=8, every=2, scheduler=plateau, scheduler_monitor="val_accuracy", lr=0.5)
    mirror = torch.optim.lr_scheduler.ReduceLROnPlateau(torch.optim.SGD([torch.zeros(1)], lr=0.5), mode="max",
                                                        patience=0, factor=0.5)
    lrs = []
    for row in result["history"]:                   # (a row's lr: its last batch's, before the epoch's step)
        lrs.append(mirror.optimizer.param_groups[0]["lr"])
        if "test_acc" in row:
            mirror.step(row["test_acc"])
    assert [row["lr"] for row in result["history"]] == lrs and len(set(lrs)) > 1
    assert made[-1].last_epoch == 4
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='max'\) decides on the test loss"):
        fit(epochs=1, scheduler=plateau)
