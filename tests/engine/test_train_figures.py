"""``train_metrics=True``: accuracy and the ``(sum, count)`` metrics of the training batches,
each batch scored by its own step's forward pass, summed over devices, processes and the
steps of an epoch as the loss is (``engine/train_figures.py``)."""
import os
import signal

import pytest
import torch
from torch import nn

import dptrain
from dptrain.core.errors import Interrupted
from dptrain.engine.train_figures import TrainFigures

torch.set_num_threads(1)

N, IGNORED = 203, 2        # 203 samples: the last batch of 32 is short and does not divide over 3 devices


def classes():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(N, 6, generator=g)
    y = (X[:, :3].sum(1) > 0).long() + (X[:, 3] > 1).long()
    y[::7] = IGNORED            # ignored by the loss: neither a hit nor counted
    return X, y


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def abs_error(output, target):
    return (output.argmax(1) - target).abs().sum(), target.numel()


def fit(devices, lr=0.0, objects=False, **kw):
    """``objects``: a macro-F1 metric object too (torchmetrics)."""
    X, y = classes()
    model = net()
    metrics = {"mae": abs_error}
    if objects:
        from torchmetrics.classification import MulticlassF1Score
        metrics["f1"] = MulticlassF1Score(3, average="macro")
    result = dptrain.fit(model, (X, y), loss=nn.CrossEntropyLoss(ignore_index=IGNORED), optimizer="sgd", lr=lr,
                         metrics=metrics, epochs=2, batch_size=32, devices=devices,
                         train_metrics=True, log=None, **kw)
    return model, result


class CtrlC(dptrain.Callback):
    """Ctrl-C (SIGINT to this process) after batch ``batch`` of epoch ``epoch``."""

    def __init__(self, epoch, batch):
        self.at = (epoch, batch)

    def on_batch_end(self, run, batch):
        if (batch.epoch, batch.batch) == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def recording(shards):
    """A forward for dict batches that records the ids of each training shard in ``shards``."""
    def forward(model, batch):
        if model.training:
            shards.append(batch["id"])
        return model(batch["x"]), batch["y"]
    return forward


def scored_apart(model, keep=slice(None)):
    """The figures of ``model`` (frozen) over the training samples ``keep``, by hand."""
    X, y = classes()
    with torch.no_grad():
        out = model(X[keep])
    y = y[keep]
    counted = y != IGNORED
    acc = int((out.argmax(1) == y)[counted].sum()) / int(counted.sum())
    return acc, float((out.argmax(1) - y).abs().sum()) / len(y)


@pytest.mark.parametrize("devices, fold_every", [(1, 32), (2, 32), (3, 32), (1, 2), (3, 3)])
def test_with_frozen_weights_the_epochs_figures_are_the_whole_training_sets(devices, fold_every, monkeypatch):
    """lr 0: every batch is scored by the same weights, so an epoch's train_acc is the model's
    accuracy over every training sample once (ignored targets left out), whatever the split,
    and however often the kept predictions are summed."""
    monkeypatch.setattr(TrainFigures, "FOLD_EVERY", fold_every)
    model, result = fit(devices)
    acc, mae = scored_apart(model)
    for row in result["history"]:
        assert row["train_acc"] == pytest.approx(acc, abs=1e-12)
        assert row["train_mae"] == pytest.approx(mae, abs=1e-12)
    assert result["train_acc"] == result["history"][-1]["train_acc"]
    assert "test_acc" not in result                        # no evaluation set: no test figures


def test_training_figures_are_the_same_on_one_two_and_three_devices_and_off_by_default():
    rows = [fit(d, lr=0.5, accumulate_grad_batches=a)[1]["history"] for d in (1, 2, 3) for a in (1, 2)]
    for other in rows[1::2]:
        for row, want in zip(other, rows[1]):
            assert row["train_acc"] == pytest.approx(want["train_acc"], abs=1e-12)
    for other in rows[::2]:
        for row, want in zip(other, rows[0]):
            assert row["train_acc"] == pytest.approx(want["train_acc"], abs=1e-12)
            assert row["train_mae"] == pytest.approx(want["train_mae"], abs=1e-12)
    assert rows[0][0]["train_acc"] != rows[0][1]["train_acc"]       # it learns: the figures move
    X, y = classes()
    plain = dptrain.fit(net(), (X, y), epochs=1, batch_size=32, devices=1, log=None)
    assert not [k for k in plain["history"][0] if k.startswith("train_") and k != "train_loss"]


def test_class_probability_targets_are_scored_by_their_arg_max():
    X, y = classes()
    y = y.clamp(max=1)
    soft = nn.functional.one_hot(y, 3).float() * 0.7 + 0.1      # rows sum to 1
    model = net()
    result = dptrain.fit(model, (X, soft), loss=nn.CrossEntropyLoss(), lr=0.0, epochs=1, batch_size=32,
                         devices=2, train_metrics=True, log=None)
    with torch.no_grad():
        want = int((model(X).argmax(1) == y).sum()) / N
    assert result["train_acc"] == pytest.approx(want, abs=1e-12)


def test_a_skipped_batch_is_left_out_as_its_loss_is():
    """on_nan="skip": the batch whose loss is NaN neither updates nor counts, on 1 and 2 devices."""
    X, y = classes()
    X[5] = float("nan")
    shards = []
    forward = recording(shards)
    rows = []
    for devices in (1, 2):
        model = net()
        result = dptrain.fit(model, {"x": X, "y": y, "id": torch.arange(N)}, forward=forward, lr=0.0,
                             loss=nn.CrossEntropyLoss(ignore_index=IGNORED), epochs=1, batch_size=32,
                             on_nan="skip", train_metrics=True, devices=devices, log=None)
        rows.append(result["history"][0])
    assert rows[0]["skipped"] == rows[1]["skipped"] == 1
    keep = torch.ones(N, dtype=torch.bool)
    keep[next(ids for ids in shards if 5 in ids)] = False      # (one device: a shard is the whole batch)
    acc, mae = scored_apart(model, keep)
    assert rows[0]["train_acc"] == pytest.approx(acc, abs=1e-12)
    assert rows[1]["train_acc"] == pytest.approx(acc, abs=1e-12)


def test_a_step_functions_logits_are_scored():
    """A model that computes its own loss (a Hugging Face-style dict output): the metrics score
    the logits it returns; without logits, the error names the fix."""
    X, y = classes()
    y = y.clamp(max=1)

    class OwnLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = net()

        def forward(self, x, labels):
            logits = self.body(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}
    model = OwnLoss()
    result = dptrain.fit(model, {"x": X, "labels": y}, step=lambda m, b: m(**b), metrics={"mae": abs_error},
                         lr=0.0, epochs=1, batch_size=32, devices=2, train_metrics=True, log=None)
    with torch.no_grad():
        out = model.body(X)
    assert result["train_mae"] == pytest.approx(float((out.argmax(1) - y).abs().sum()) / N, abs=1e-12)
    with pytest.raises(ValueError, match="train_metrics need outputs and targets: let step return a dict"):
        dptrain.fit(model, {"x": X, "labels": y}, step=lambda m, b: m(**b)["loss"], metrics={"mae": abs_error},
                    epochs=1, batch_size=32, devices=1, train_metrics=True, log=None)
    said = []
    result = dptrain.fit(model, {"x": X, "labels": y}, step=lambda m, b: m(**b), epochs=1, batch_size=32,
                         devices=1, train_metrics=True, log=said.append, progress=False)
    assert any(line.startswith("train_metrics: nothing to score on the training batches") for line in said), said
    assert list(result["history"][0]) == ["epoch", "sec", "train_loss"]


def test_an_epoch_stopped_mid_way_and_resumed_gives_the_unbroken_figures(tmp_path):
    """Ctrl-C in epoch 2 saves every process's partial sums with the loss's: the resumed run's
    rows are the unbroken run's."""
    whole = fit(2, lr=0.5, checkpoint_dir=str(tmp_path / "a"))[1]["history"]

    with pytest.raises(Interrupted, match="stopped by SIGINT at epoch 2, batch 3"):
        fit(2, lr=0.5, checkpoint_dir=str(tmp_path / "b"), callbacks=[CtrlC(2, 3)])
    resumed = fit(2, lr=0.5, checkpoint_dir=str(tmp_path / "b"), resume=True)[1]["history"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "sec"} for r in rows]    # noqa: E731
    assert strip(resumed) == strip(whole)


def test_a_checkpoint_without_the_sums_is_resumed_and_says_what_the_figures_cover(tmp_path):
    X, y = classes()
    with pytest.raises(Interrupted):
        dptrain.fit(net(), (X, y), epochs=1, batch_size=32, devices=1, checkpoint_dir=str(tmp_path), log=None,
                    callbacks=[CtrlC(1, 3)])
    said = []
    result = dptrain.fit(net(), (X, y), epochs=1, batch_size=32, devices=1, checkpoint_dir=str(tmp_path),
                         resume=True, train_metrics=True, log=said.append, progress=False)
    assert "resuming: the checkpoint has no train_metrics sums for epoch 1: its training figures cover batches " \
           "4 to 7 only" in said, said
    assert 0.0 <= result["train_acc"] <= 1.0


def test_metric_objects_score_the_whole_epochs_training_batches_on_any_devices():
    """lr 0: a macro-F1 object over an epoch's training batches is its F1 over every training
    sample (the devices' copies merged), on 1-3 devices; a skipped NaN batch is not in it."""
    tm = pytest.importorskip("torchmetrics")
    X, y = classes()
    y = y.clamp(max=1)              # (no ignored target: torchmetrics would count it)
    for devices in (1, 2, 3):
        model = net()
        result = dptrain.fit(model, (X, y), loss=nn.CrossEntropyLoss(), lr=0.0, epochs=2, batch_size=32,
                             metrics={"f1": tm.classification.MulticlassF1Score(3, average="macro")},
                             devices=devices, train_metrics=True, log=None)
        with torch.no_grad():
            want = float(tm.functional.classification.multiclass_f1_score(model(X), y, 3, average="macro"))
        assert [row["train_f1"] for row in result["history"]] == pytest.approx([want, want], abs=1e-6)
    bad = X.clone()
    bad[5] = float("nan")
    shards = []
    forward = recording(shards)
    model = net()
    result = dptrain.fit(model, {"x": bad, "y": y, "id": torch.arange(N)}, forward=forward, lr=0.0, epochs=1,
                         batch_size=32, metrics={"f1": tm.classification.MulticlassF1Score(3, average="macro")},
                         on_nan="skip", devices=1, train_metrics=True, log=None)
    keep = torch.ones(N, dtype=torch.bool)
    keep[next(ids for ids in shards if 5 in ids)] = False
    with torch.no_grad():
        want = float(tm.functional.classification.multiclass_f1_score(model(X[keep]), y[keep], 3, average="macro"))
    assert result["history"][0]["skipped"] == 1 and result["train_f1"] == pytest.approx(want, abs=1e-6)


@pytest.mark.filterwarnings("ignore:No positive samples")        # (class 2 has none: its AUC is 0)
def test_a_mid_epoch_resume_keeps_the_metric_objects_state(tmp_path):
    """F1 (tensor states) and AUROC (list states) on the training batches: a Ctrl-C after
    batch 3 and a resume give the unbroken run's figures (their states ride in the checkpoint)."""
    tm = pytest.importorskip("torchmetrics")

    X, y = classes()
    y = y.clamp(max=1)

    def metrics():
        return {"f1": tm.classification.MulticlassF1Score(3, average="macro"),
                "auc": tm.classification.MulticlassAUROC(3, thresholds=None)}
    for devices in (1, 2):
        kw = dict(loss=nn.CrossEntropyLoss(), epochs=2, batch_size=32, devices=devices, train_metrics=True)
        torch.manual_seed(0)
        whole = dptrain.fit(net(), (X, y), log=None, metrics=metrics(), **kw)["history"]
        where = str(tmp_path / str(devices))
        torch.manual_seed(0)
        with pytest.raises(Interrupted):
            dptrain.fit(net(), (X, y), log=None, callbacks=[CtrlC(1, 3)], checkpoint_dir=where, metrics=metrics(),
                        **kw)
        said = []
        torch.manual_seed(0)
        rows = dptrain.fit(net(), (X, y), resume=True, log=said.append, progress=False, checkpoint_dir=where,
                           metrics=metrics(), **kw)["history"]
        assert not any("NaN" in line for line in said), said
        for row, want in zip(rows, whole):
            for key in ("train_f1", "train_auc", "train_acc"):
                assert row[key] == pytest.approx(want[key], abs=1e-6), (devices, key)


def test_a_mid_epoch_resume_keeps_the_state_of_what_training_step_logs(tmp_path):
    """A LightningModule's own F1 object, updated and logged in its training_step: its state
    rides in the mid-epoch checkpoint too, so the resumed epoch's train_f1 is the whole epoch's."""
    pytest.importorskip("torchmetrics")
    from tests.engine.test_lightning_module import TrainLogging, data
    for devices in (1, 2):
        kw = dict(epochs=2, batch_size=16, devices=devices, progress=False)
        torch.manual_seed(0)
        whole = dptrain.fit(TrainLogging(), data(88), data(32, 1), log=None, **kw)["history"]
        where = str(tmp_path / str(devices))
        torch.manual_seed(0)
        with pytest.raises(Interrupted):
            dptrain.fit(TrainLogging(), data(88), data(32, 1), log=None, callbacks=[CtrlC(1, 3)], checkpoint_dir=where,
                        **kw)
        said = []
        torch.manual_seed(0)
        rows = dptrain.fit(TrainLogging(), data(88), data(32, 1), resume=True, log=said.append, checkpoint_dir=where,
                           **kw)["history"]
        assert not any("NaN" in line for line in said), said
        for row, want in zip(rows, whole):
            for key in ("train_f1", "train_acc", "train_loss"):
                assert row[key] == pytest.approx(want[key], abs=1e-6), (devices, key)
