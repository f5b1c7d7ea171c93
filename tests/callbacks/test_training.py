"""EarlyStopping, BestCheckpoint and EMA: the same epoch on 1 and 2 devices, the best epoch's
weights, an EMA equal to one computed by hand; their checks."""
from pathlib import Path

import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks import EMA, BestCheckpoint, EarlyStopping


def regression(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    return X, X @ torch.randn(5, 1, generator=g) + 0.3 * torch.randn(n, 1, generator=g)


class Snapshots(dptrain.Callback):
    """The weights after every epoch and after every step that updated them."""
    def __init__(self):
        self.epochs, self.steps = {}, []

    def on_batch_end(self, run, batch):
        if batch.result.stepped:
            self.steps.append({k: v.detach().clone() for k, v in run.model.state_dict().items()})

    def on_epoch_end(self, run, epoch, row):
        self.epochs[epoch] = {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def train(devices, callbacks, epochs=12, lr=0.3, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    kw.setdefault("log", None)
    result = dptrain.fit(model, regression(), regression(40, 1), loss=nn.MSELoss(), lr=lr, epochs=epochs,
                         batch_size=16, devices=devices, callbacks=callbacks, progress=False, **kw)
    return model, result


def test_bad_arguments_are_errors_naming_them():
    for bad, message in ((dict(patience=0), "patience must be a whole number >= 1"),
                         (dict(mode="up"), "mode must be 'min', 'max' or 'auto'")):
        with pytest.raises(ValueError, match=message):
            EarlyStopping(**bad)
    with pytest.raises(ValueError, match="decay must be a number in .0, 1."):
        EMA(1.0)


def test_early_stopping_stops_at_the_same_epoch_on_1_and_2_devices():
    """A learning rate too high to settle: the test loss stops improving, and both stop after
    the same epoch with the same best epoch."""
    stops = []
    for devices in (1, 2):
        stop = EarlyStopping("test_loss", patience=2)
        _, result = train(devices, [stop], epochs=30, lr=0.3)
        stops.append((len(result["history"]), stop.stopped_epoch, stop.watch.best_epoch))
        losses = [r["test_loss"] for r in result["history"]]
        assert stop.watch.best == min(losses) and losses.index(min(losses)) + 1 == stop.watch.best_epoch
    assert stops[0] == stops[1] and stops[0][0] < 30 and stops[0][0] == stops[0][1] == stops[0][2] + 2


def test_keras_and_lightnings_val_names_watch_the_evaluation_figures(tmp_path):
    """EarlyStopping("val_loss") stops where EarlyStopping("test_loss") does, and says once
    which figure it watches; with eval_every=2 the epochs not evaluated are passed over;
    BestCheckpoint("val_accuracy")'s file is the best test_acc epoch's."""
    stops, lines = [], []
    for name in ("test_loss", "val_loss"):
        stop = EarlyStopping(name, patience=2)
        _, result = train(1, [stop], epochs=30, lr=0.3, eval_every=2, log=lines.append)
        stops.append((len(result["history"]), stop.stopped_epoch, stop.watch.best_epoch, stop.watch.best))
    assert stops[0] == stops[1] and stops[0][0] < 30 and stops[0][2] % 2 == 0
    assert lines.count("EarlyStopping: val_loss (Keras's and Lightning's name) is watched as test_loss, "
                       "the eval_data's figure here") == 1
    X, y = regression()
    data = torch.utils.data.TensorDataset(X, (y > 0).long().squeeze(1))
    best = BestCheckpoint(tmp_path / "best.pt", monitor="val_accuracy")
    torch.manual_seed(0)
    result = dptrain.fit(nn.Linear(5, 2), data, data, epochs=4, batch_size=16, lr=0.05, callbacks=[best],
                         progress=False, log=None)
    accs = [r["test_acc"] for r in result["history"]]
    assert torch.load(best.path)["value"] == max(accs) and best.best_epoch == accs.index(max(accs)) + 1
    keras = BestCheckpoint(tmp_path / "weights.{epoch:02d}-{val_loss:.2f}.pt", monitor="val_loss")   # Keras's example
    torch.manual_seed(0)
    result = dptrain.fit(nn.Linear(5, 2), data, data, epochs=3, batch_size=16, lr=0.05, callbacks=[keras],
                         progress=False, log=None)
    last = result["history"][-1]                 # (the loss falls every epoch: the last is the best)
    assert keras.best_path == str(tmp_path / f"weights.03-{last['test_loss']:.2f}.pt")
    assert sorted(p.name for p in tmp_path.glob("weights.*")) == [Path(keras.best_path).name]


def test_start_from_epoch_leaves_the_first_epochs_unwatched():
    """Keras's start_from_epoch (Lightning's min_epochs): with a learning rate of 0 no epoch
    is better than the first watched, so the run stops `patience` epochs after it."""
    for start, stopped in ((0, 3), (3, 6)):
        stop = EarlyStopping("test_loss", patience=2, start_from_epoch=start, restore_best_weights=True)
        _, result = train(2, [stop], epochs=20, lr=0.0)
        assert (len(result["history"]), stop.stopped_epoch, stop.watch.best_epoch) == (stopped, stopped, start + 1)
        assert result["restored_epoch"] == start + 1
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"start_from_epoch must be a whole number >= 0, got {bad!r}"):
            EarlyStopping(start_from_epoch=bad)


def test_verbose_says_each_evaluation_heard_and_each_file_saved(tmp_path):
    """Keras's verbose=1 and Lightning's verbose=True, as their programs pass them."""
    lines = []
    stop = EarlyStopping("val_loss", patience=2, verbose=1)
    best = BestCheckpoint(tmp_path / "b-{epoch}.pt", monitor="test_loss", verbose=True)
    _, result = train(1, [stop, best], epochs=20, lr=0.0, log=lines.append)       # lr 0: the first is the best
    said = [line for line in lines if line.startswith(("EarlyStopping", "BestCheckpoint"))]
    loss = result["history"][0]["test_loss"]
    assert said[1:] == [f"EarlyStopping: epoch 1, test_loss {loss:.4g}, the best so far",
                        f"BestCheckpoint: test_loss {loss:.4g} at epoch 1, saved {tmp_path / 'b-1.pt'}"] + [
        f"EarlyStopping: epoch {n + 1}, test_loss {loss:.4g}, not better than {loss:.4g} (epoch 1) for {n} of 2"
        for n in (1, 2)]
    quiet = []
    train(1, [EarlyStopping("test_loss", patience=2), BestCheckpoint(tmp_path / "q.pt")], epochs=20, lr=0.0,
          log=quiet.append)
    assert not [line for line in quiet if line.startswith(("EarlyStopping", "BestCheckpoint"))]
    for bad in (-1, "yes"):
        with pytest.raises(ValueError, match=f"verbose must be True, False or a number >= 0, got {bad!r}"):
            EarlyStopping(verbose=bad)


def test_an_evaluation_figure_without_an_evaluation_set_is_an_error_before_the_first_epoch(tmp_path):
    class Counted(dptrain.Callback):
        epochs = 0

        def on_epoch_start(self, run, epoch):
            Counted.epochs += 1

    for cb, owner in ((EarlyStopping("val_loss"), "EarlyStopping"),
                      (BestCheckpoint(tmp_path / "b.pt", monitor="test_acc"), r"BestCheckpoint\('.*b.pt'\)")):
        torch.manual_seed(0)
        with pytest.raises(ValueError, match=f"{owner} monitors (val_loss|test_acc), a figure of the evaluation, but "
                                             f"the run has no evaluation set: give eval_data .or validation_split="):
            dptrain.fit(nn.Linear(5, 1), regression(), loss=nn.MSELoss(), epochs=3, callbacks=[Counted(), cb],
                        progress=False, log=None)
    assert Counted.epochs == 0

    class OwnFigure(dptrain.Callback):           # a figure of the user's, under an evaluation's name
        def on_epoch_end(self, run, epoch, row):
            row["test_own"] = 1.0 / epoch

    stop = EarlyStopping("test_own", mode="max", patience=2)
    result = dptrain.fit(nn.Linear(5, 1), regression(), loss=nn.MSELoss(), epochs=10, callbacks=[OwnFigure(), stop],
                         progress=False, log=None)
    assert len(result["history"]) == 3 and stop.watch.best_epoch == 1


def test_the_best_checkpoint_holds_the_best_epochs_weights(tmp_path):
    path = tmp_path / "best.pt"
    best, snaps = BestCheckpoint(str(path), monitor="test_loss"), Snapshots()
    model, result = train(2, [best, snaps], epochs=8, lr=0.3)
    losses = [r["test_loss"] for r in result["history"]]
    epoch = losses.index(min(losses)) + 1
    saved = torch.load(path, weights_only=True)
    assert saved["epoch"] == best.best_epoch == epoch and saved["value"] == min(losses)
    for k, v in snaps.epochs[epoch].items():
        assert torch.equal(saved["model"][k], v), k
    fresh = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    fresh.load_state_dict(saved["model"])                 # the documented way back
    with pytest.raises(ValueError, match="best.pt already exists .another run's best weights..: pass "
                                         "overwrite=True"):
        train(1, [BestCheckpoint(str(path))], epochs=1)
    with pytest.raises(ValueError, match="already exists"):        # its own False wins over the run's
        train(1, [BestCheckpoint(str(path), overwrite=False)], epochs=1, overwrite=True)
    train(1, [BestCheckpoint(str(path))], epochs=1, overwrite=True)
    assert torch.load(path, weights_only=True)["epoch"] == 1
    torch.save({"epoch": 99}, path)
    train(1, [BestCheckpoint(str(path), overwrite=True)], epochs=1)       # as Keras's ModelCheckpoint
    assert torch.load(path, weights_only=True)["epoch"] == 1


@pytest.mark.parametrize("devices", [1, 2])
def test_ema_equals_one_computed_by_hand(devices):
    ema, snaps = EMA(decay=0.9), Snapshots()
    torch.manual_seed(0)
    start = {k: v.clone() for k, v in nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1)).state_dict().items()}
    model, _ = train(devices, [ema, snaps], epochs=3)
    expected = {k: v.clone() for k, v in start.items()}
    for weights in snaps.steps:
        for k in expected:
            expected[k] = 0.9 * expected[k] + 0.1 * weights[k]
    assert ema.updates == len(snaps.steps) == 3 * 6
    for k in expected:
        torch.testing.assert_close(ema.weights[k], expected[k], rtol=1e-6, atol=1e-7)
    ema.copy_to(model)
    assert all(torch.equal(model.state_dict()[k], ema.weights[k]) for k in expected)


class EMAEachEpoch(dptrain.Callback):
    """A copy of an EMA's average at every epoch's end."""
    def __init__(self, ema):
        self.ema, self.epochs = ema, {}

    def on_epoch_end(self, run, epoch, row):
        self.epochs[epoch] = {k: v.clone() for k, v in self.ema.weights.items()}


def mse_of(weights):
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    model.load_state_dict(weights)
    X, y = regression(40, 1)
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(X), y))


@pytest.mark.parametrize("devices", [1, 2])
def test_ema_evaluate_scores_the_average_and_trains_as_without(devices, tmp_path):
    """EMA(evaluate=True): each epoch's test loss is the average's (computed apart), training
    is bit for bit the run without it, and BestCheckpoint keeps the average that scored best."""
    plain_model, plain = train(devices, [EMA(decay=0.9)], epochs=4)
    ema = EMA(decay=0.9, evaluate=True)
    seen, best = EMAEachEpoch(ema), BestCheckpoint(str(tmp_path / "best.pt"))
    model, result = train(devices, [ema, seen, best], epochs=4)
    for k, v in plain_model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k            # the trained weights came back
    losses = [r["test_loss"] for r in result["history"]]
    assert [r["train_loss"] for r in result["history"]] == [r["train_loss"] for r in plain["history"]]
    for epoch, loss in enumerate(losses, 1):
        assert loss == pytest.approx(mse_of(seen.epochs[epoch]), rel=1e-5)
        assert loss != pytest.approx(plain["history"][epoch - 1]["test_loss"], rel=1e-3)   # not the model's
    saved = torch.load(tmp_path / "best.pt", weights_only=True)
    assert saved["epoch"] == losses.index(min(losses)) + 1
    for k, v in seen.epochs[saved["epoch"]].items():
        assert torch.equal(saved["model"][k], v), k


def test_early_stopping_restores_the_best_epochs_weights():
    """Stopped 2 epochs after its best epoch (on 2 devices): the model ends with that
    epoch's weights, not the last epoch's, and says so."""
    stop, snaps = EarlyStopping("test_loss", patience=2, restore_best_weights=True), Snapshots()
    lines = []
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    result = dptrain.fit(model, regression(), regression(40, 1), loss=nn.MSELoss(), lr=0.3, epochs=30,
                         batch_size=16, devices=2, callbacks=[stop, snaps], log=lines.append, progress=False)
    best = stop.watch.best_epoch
    assert best < len(result["history"]) < 30                       # stopped later than the best epoch
    for k, v in snaps.epochs[best].items():
        assert torch.equal(model.state_dict()[k], v), k
    assert f"restored the weights of epoch {best} (test_loss {stop.watch.best:.4g})" in lines
    # The result's figures are the restored epoch's, and the closing line says whose they are.
    assert result["test_loss"] == stop.watch.best == result["history"][best - 1]["test_loss"]
    assert result["train_loss"] == result["history"][best - 1]["train_loss"] and result["restored_epoch"] == best
    assert lines[-1].startswith(f"test loss: {stop.watch.best:.3f} (the weights of epoch {best}, restored), ")
    assert not torch.equal(model.state_dict()["0.weight"], snaps.epochs[len(result["history"])]["0.weight"])
    with pytest.raises(TypeError, match="restore_best_weights must be True or False, got 'yes'"):
        EarlyStopping(restore_best_weights="yes")
    with pytest.raises(TypeError, match="evaluate must be True or False"):
        EMA(evaluate=1)


def test_weights_that_do_not_fit_are_named():
    class Wrong(dptrain.Callback):
        def on_evaluate_start(self, run, epoch):
            run.load_weights({"0.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="the weights given to run.load_weights cannot be loaded into this model: "):
        train(2, [Wrong()], epochs=1)


def test_early_stopping_hears_step_evaluations_and_restores_the_best_steps_weights():
    """eval_every_n_steps=2 (6 batches an epoch): patience counts those evaluations, each once
    (the epoch's evaluation of the weights step 6 scored is not counted again); the run stops
    mid-epoch and ends with the best step's weights, its figures in the result."""
    stop = EarlyStopping("test_loss", patience=3, restore_best_weights=True)
    lines = []
    model, result = train(1, [stop], epochs=30, lr=0.3, eval_every_n_steps=2, log=lines.append)
    evaluated = [r for r in result["step_history"] if "test_loss" in r]
    losses = [r["test_loss"] for r in evaluated]
    best = evaluated[losses.index(min(losses))]
    # It stopped at the 3rd evaluation past the best (a stop lands after the batch it is asked in).
    assert evaluated.index(best) + 3 == len(evaluated) - 1 and stop.watch.best_step == best["step"]
    assert f"did not improve for 3 evaluation(s) (best {min(losses):.4g} at step {best['step']} (epoch " in \
        "\n".join(lines)
    assert result["restored_step"] == best["step"] and result["test_loss"] == best["test_loss"]
    assert lines[-1].startswith(f"test loss: {best['test_loss']:.3f} (the weights of step {best['step']}, restored)") \
        and lines[-1].endswith("sec/epoch on [cpu:0]")
    assert dptrain.evaluate(model, regression(40, 1), loss=nn.MSELoss(), batch_size=16)["test_loss"] == \
        pytest.approx(best["test_loss"], rel=1e-6)


def test_a_figure_gone_nan_stops_at_once_unless_check_finite_is_false():
    """Lightning's check_finite: a NaN figure ends the run at that epoch (patience would wait
    for an improvement that cannot come); check_finite=False lets patience run on."""
    gone = {"from": 2}

    class Epoch(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            gone["epoch"] = epoch

    def mae(out, target):
        nan = gone["epoch"] >= gone["from"]
        return (out - target).abs().sum() * (float("nan") if nan else 1.0), len(target)
    for check, epochs in ((True, 2), (False, 4)):
        stop = EarlyStopping("test_mae", patience=3, check_finite=check)
        lines = []
        _, result = train(1, [Epoch(), stop], epochs=8, lr=0.01, metrics={"mae": mae}, log=lines.append)
        assert len(result["history"]) == epochs == stop.stopped_epoch
        assert ("stopped after epoch 2: test_mae is nan, not finite (check_finite=False: patience runs on)"
                in lines) is check
    with pytest.raises(TypeError, match="check_finite must be True or False, got 1"):
        EarlyStopping(check_finite=1)


def test_thresholds_stop_at_a_target_at_divergence_and_hold_patience_to_a_baseline():
    """A run whose test loss falls every epoch (lr 0.05): stopping_threshold stops at the first
    epoch under it; divergence_threshold at once when the first is above it; a baseline under
    every loss of the run lets patience run out though each epoch is a best."""
    def train(callbacks, log=None):         # (scored on its training data: the loss falls every epoch)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
        return model, dptrain.fit(model, regression(), regression(), loss=nn.MSELoss(), lr=0.05, epochs=8,
                                  batch_size=16, devices=1, callbacks=callbacks, progress=False, log=log)
    _, whole = train([])
    losses = [r["test_loss"] for r in whole["history"]]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    target = (losses[3] + losses[4]) / 2                    # reached at epoch 5
    lines = []
    stop = EarlyStopping("test_loss", patience=3, stopping_threshold=target, restore_best_weights=True)
    _, result = train([stop], log=lines.append)
    assert len(result["history"]) == stop.stopped_epoch == 5 and result["restored_epoch"] == 5
    assert f"stopped after epoch 5: test_loss {losses[4]:.4g} reached stopping_threshold {target:.4g}" in lines
    stop = EarlyStopping("test_loss", patience=3, divergence_threshold=losses[0] / 2)
    _, result = train([stop])
    assert len(result["history"]) == 1
    stop = EarlyStopping("test_loss", patience=3, baseline=losses[-1] / 2, verbose=True)
    lines = []
    _, result = train([stop], log=lines.append)
    assert len(result["history"]) == 3 and stop.watch.best_epoch == 3
    assert f"EarlyStopping: epoch 2, test_loss {losses[1]:.4g}, not past the baseline {losses[-1] / 2:.4g} for 2 of 3" \
        in lines
    for bad in ("low", float("nan"), True):
        with pytest.raises(ValueError, match=f"baseline must be a number .or None., got {bad!r}"):
            EarlyStopping(baseline=bad)
