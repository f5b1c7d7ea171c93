"""A LightningModule handed to fit as it is: training_step, validation_step, configure_optimizers."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain


class Lit(nn.Module):
    """A LightningModule's shape (without Lightning: its methods are what fit reads)."""

    def __init__(self, val_returns=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.val_returns, self.seen = val_returns, []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(("train" if self.training else "eval", batch_idx))
        return {"loss": F.cross_entropy(self(x), y)}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(("val", batch_idx))
        return 2 * F.cross_entropy(self(x), y) if self.val_returns else None     # (most only self.log it)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                                   "interval": "epoch"}}


class LightningLike(nn.Module):
    """Lightning's LightningModule's trainer plumbing: ``trainer``, ``current_epoch`` and
    ``global_step`` read its ``_trainer`` (0 without one), which a copy leaves out."""
    __module__ = "lightning.pytorch.core.module"

    def __init__(self):
        super().__init__()
        self._trainer = None

    @property
    def trainer(self):
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`.")
        return self._trainer

    @property
    def current_epoch(self):
        return self.trainer.current_epoch if self._trainer else 0

    @property
    def global_step(self):
        return self.trainer.global_step if self._trainer else 0

    @property
    def logger(self):
        return self._trainer.logger if self._trainer is not None else None

    def optimizers(self, use_pl_optimizer=True):
        opts = self.trainer.strategy._lightning_optimizers if use_pl_optimizer else self.trainer.optimizers
        return opts[0] if isinstance(opts, list) and len(opts) == 1 else opts

    def lr_schedulers(self):
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        return None if not schedulers else schedulers[0] if len(schedulers) == 1 else schedulers

    def all_gather(self, data, group=None, sync_grads=False):
        """Lightning's: each process's tensor stacked, by its trainer's strategy."""
        return self.trainer.strategy.all_gather(torch.as_tensor(data), group=group, sync_grads=sync_grads)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_trainer"] = None
        return state


def data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 1).long()


def plain_loop(model, epochs=2, batch=16):
    """Lightning's automatic optimization by hand, on the samples in order."""
    config = model.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    X, y = data()
    for _ in range(epochs):
        for i in range(0, len(X), batch):
            loss = model.training_step((X[i:i + batch], y[i:i + batch]), i // batch)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()


@pytest.mark.parametrize("devices", [1, 2])
def test_a_lightning_module_trains_as_lightnings_automatic_optimization_does(devices):
    torch.manual_seed(0)
    model = Lit()
    expected = copy.deepcopy(model)
    plain_loop(expected)
    lines = []
    result = dptrain.fit(model, data(), data(32, 1), epochs=2, batch_size=16, shuffle=False, devices=devices,
                         progress=False, log=lines.append)
    for a, b in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert lines[0].startswith("dptrain: model.training_step is the step and validation_step evaluates (a "
                               "LightningModule's)")
    assert "dptrain: the optimizer is model.configure_optimizers()'s (a LightningModule's), called once the " \
           "training data is loaded" in lines
    assert not any("no optimizer given" in line for line in lines)
    assert [r["lr"] for r in result["history"]] == [0.01, 0.005]
    # batch_idx: each batch's index in its epoch, training and evaluation; validation_step was
    # asked once (it returned None), then the evaluation used training_step.
    train = [i for kind, i in model.seen if kind == "train"]
    assert train[-12:] == list(range(6)) * 2 and [i for kind, i in model.seen if kind == "val"] == [0]
    assert [i for kind, i in model.seen if kind == "eval"][-2:] == [0, 1]
    X, y = data(32, 1)
    with torch.no_grad():
        assert result["test_loss"] == pytest.approx(F.cross_entropy(model(X), y).item(), rel=1e-5)
    assert dptrain.evaluate(model, data(32, 1), batch_size=16, devices=devices) == \
        pytest.approx({"test_loss": result["test_loss"]}, rel=1e-6)


def test_a_validation_step_returning_its_loss_evaluates():
    torch.manual_seed(0)
    model = Lit(val_returns=True)
    result = dptrain.fit(model, data(), data(32, 1), epochs=1, batch_size=16, devices=2, log=None)
    X, y = data(32, 1)
    with torch.no_grad():
        assert result["test_loss"] == pytest.approx(2 * F.cross_entropy(model(X), y).item(), rel=1e-5)
    # training_step in eval mode: once, the trial before training (what it logs), never for the test loss.
    assert [i for kind, i in model.seen if kind == "eval"] == [0] and model.seen[0] == ("eval", 0)
    assert dptrain.evaluate(model, data(32, 1))["test_loss"] == pytest.approx(result["test_loss"], rel=1e-6)


class Logging(Lit):
    """A validation_step as Lightning programs write it: figures logged, nothing returned."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.seen.append(("val", batch_idx))
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val/acc", (logits.argmax(1) == y).float().mean())
        self.log_dict({"val_top2": (logits.topk(2, 1).indices == y[:, None]).any(1).float().mean(), "val_one": 1})
        return {"val_loss": F.cross_entropy(logits, y), "preds": logits.argmax(1)}     # (Lightning 1's: not a loss)


@pytest.mark.parametrize("devices", [1, 2])
def test_what_validation_step_logs_is_the_evaluations_figures_over_the_whole_set(devices):
    """Each logged mean counts its batch's samples: the figure is the whole set's, on any
    split (the evaluation set, 40, does not divide into batches of 16 or devices evenly)."""
    from dptrain.callbacks import EarlyStopping
    torch.manual_seed(0)
    model = Logging()
    stop = EarlyStopping("val_acc", patience=5)
    result = dptrain.fit(model, data(), data(40, 1), epochs=2, batch_size=16, devices=devices, log=None,
                         callbacks=[stop])
    X, y = data(40, 1)
    with torch.no_grad():
        logits = model(X)
    expected = {"test_loss": F.cross_entropy(logits, y).item(),
                "test_acc": (logits.argmax(1) == y).float().mean().item(),
                "test_top2": (logits.topk(2, 1).indices == y[:, None]).any(1).float().mean().item(), "test_one": 1.0}
    assert {k: result[k] for k in expected} == pytest.approx(expected, rel=1e-5)
    # (the logged loss is the test loss: training_step in eval mode only for the trial before training)
    assert [i for kind, i in model.seen if kind == "eval"] == [0]
    assert stop.watch.monitor == "test_acc" and stop.watch.best is not None
    assert dptrain.evaluate(model, data(40, 1), batch_size=16, devices=devices) == pytest.approx(expected, rel=1e-5)


def test_logged_figures_beside_metrics_of_the_logits_validation_step_returns():
    """validation_step returning {"loss", "logits"} feeds fit's metrics= (a torchmetrics F1 over
    the whole set) while what it logs is kept too."""
    from torchmetrics.classification import MulticlassF1Score

    class Both(Logging):
        def validation_step(self, batch, batch_idx):
            super().validation_step(batch, batch_idx)
            logits = self(batch[0])
            return {"loss": 3 * F.cross_entropy(logits, batch[1]), "logits": logits}
    torch.manual_seed(0)
    model = Both()
    result = dptrain.fit(model, data(), data(40, 1), epochs=1, batch_size=16, devices=2, log=None,
                         metrics={"f1": MulticlassF1Score(3, average="macro")})
    X, y = data(40, 1)
    with torch.no_grad():
        logits = model(X)
    f1 = MulticlassF1Score(3, average="macro")(logits, y).item()
    assert result["test_f1"] == pytest.approx(f1, rel=1e-5)
    assert result["test_acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item(), rel=1e-5)
    assert result["test_loss"] == pytest.approx(3 * F.cross_entropy(logits, y).item(), rel=1e-5)   # (returned)


@pytest.mark.parametrize("devices", [1, 2])
def test_torchmetrics_objects_the_module_updates_and_logs_are_computed_over_the_whole_set(devices):
    """Lightning's and torchmetrics' way: the module holds the metric, validation_step updates
    it and logs the object; each device's copy of the module updates its own, merged after the
    evaluation (a macro F1 is not a mean of batch figures: only the merged state gives it)."""
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    class Metrics(Lit):
        def __init__(self):
            super().__init__()
            self.val_acc, self.val_f1 = MulticlassAccuracy(3), MulticlassF1Score(3, average="macro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.val_acc(logits, y)                          # (forward: updates, gives the batch's)
            self.val_f1.update(logits, y)
            self.log_dict({"val_acc": self.val_acc, "val_f1": self.val_f1})
            return F.cross_entropy(logits, y)
    torch.manual_seed(0)
    model = Metrics()
    result = dptrain.fit(model, data(), data(40, 1), epochs=2, batch_size=16, devices=devices, log=None)
    X, y = data(40, 1)
    with torch.no_grad():
        logits = model(X)
    expected = {"test_acc": MulticlassAccuracy(3)(logits, y).item(),
                "test_f1": MulticlassF1Score(3, average="macro")(logits, y).item()}
    assert {k: result[k] for k in expected} == pytest.approx(expected, rel=1e-5)
    assert [set(row) >= {"test_acc", "test_f1"} for row in result["history"]] == [True, True]
    assert {k: v for k, v in dptrain.evaluate(model, data(40, 1), batch_size=16, devices=devices).items()
            if k in expected} == pytest.approx(expected, rel=1e-5)


def test_a_compiled_replica_runs_the_steps_through_its_compiled_forward():
    """--compile hands the steps torch.compile's wrapper: training_step must call self(x) on it
    (the compiled forward), the wrapper giving the rest (self.net, self.log) from the module."""
    from dptrain.engine.lightning_module import LightningSteps
    called = []

    class Wrapper(nn.Module):                       # (torch's OptimizedModule's shape)
        def __init__(self, module):
            super().__init__()
            self._orig_mod = module

        def forward(self, x):
            called.append("compiled")
            return self._orig_mod(x)

        def __getattr__(self, name):
            if name == "_orig_mod":
                return super().__getattr__(name)
            return getattr(self._orig_mod, name)
    model = Logging()
    steps = LightningSteps(model)
    X, y = data(8)
    loss = steps(Wrapper(model), (X, y))
    assert called == ["compiled"] and loss["loss"].shape == ()
    out = steps(Wrapper(model).eval(), (X, y))      # validation_step: its log is recorded on the wrapper
    assert called == ["compiled"] * 2 and set(steps.validated.latest.get()) == {"loss", "acc", "top2", "one"}
    with torch.no_grad():
        assert out["loss"] == pytest.approx(F.cross_entropy(model(X), y).item())


def test_what_cannot_be_kept_as_a_mean_is_an_error_naming_the_fix():
    class Counter:                                  # (a torchmetrics object's shape: a state, computed)
        def update(self, *args):
            pass

        def reset(self):
            pass

        def compute(self):
            return torch.tensor(1.0)

    class Objects(Lit):
        def validation_step(self, batch, batch_idx):
            self.log("val_f1", [1.0])

    class Largest(Lit):
        def validation_step(self, batch, batch_idx):
            self.log("val_worst", F.cross_entropy(self(batch[0]), batch[1]), reduce_fx="max")
    with pytest.raises(ValueError, match=r"self.log\('val_f1', list\) in validation_step: dptrain records one "
                                         r"number .a batch's mean. or a torchmetrics object; log the batch's mean"):
        dptrain.fit(Objects(), data(), data(8), epochs=1, log=None, devices=1)

    class Outside(Lit):                             # a metric object the module does not hold
        def validation_step(self, batch, batch_idx):
            self.log("val_f1", Counter())
    with pytest.raises(ValueError, match=r"self.log\(..., Counter\) for 'f1' logs a metric that is not an attribute "
                                         r"of the module \(validation_step\): make it one"):
        dptrain.fit(Outside(), data(), data(8), epochs=1, log=None, devices=1)
    with pytest.raises(ValueError, match=r"reduce_fx='max'\): dptrain keeps the mean over the evaluation set"):
        dptrain.fit(Largest(), data(), data(8), epochs=1, log=None, devices=1)
    model = Logging()
    dptrain.fit(model, data(), data(8), epochs=1, log=None, devices=1)
    assert "log" not in model.__dict__ and "log_dict" not in model.__dict__      # (the recorders are gone)


def test_what_fit_is_given_wins_and_what_it_cannot_run_is_an_error():
    class NoLoss(Lit):
        def training_step(self, batch):              # (no batch_idx: Lightning passes it when asked)
            return None
    with pytest.raises(ValueError, match="model.training_step returned None: return the loss"):
        dptrain.fit(NoLoss(), data(), epochs=1, log=None, devices=1)

    class ReadsTheTrainer(Lit):
        @property
        def trainer(self):                           # (Lightning's, without a Trainer)
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`.")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1.0 / self.trainer.estimated_stepping_batches)
    with pytest.raises(RuntimeError, match=r"is not attached to a `Trainer`. \(dptrain called "
                                           r"model.configure_optimizers\(\), a LightningModule's, and it reads the "
                                           r"Trainer, which dptrain does not make: give fit optimizer= and scheduler="):
        dptrain.fit(ReadsTheTrainer(), data(), epochs=1, log=None)

    class EpochFromTheTrainer(ReadsTheTrainer):
        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch[0]), batch[1]) * self.trainer.current_epoch
    with pytest.raises(RuntimeError, match=r"\(dptrain called model.training_step, a LightningModule's, and it reads "
                                           r"the Trainer, which dptrain does not make: read what you need from the run "
                                           r"in a callback"):
        dptrain.fit(EpochFromTheTrainer(), data(), epochs=1, log=None, optimizer=torch.optim.SGD, lr=0.1)

    class OwnBackward(Lit):                          # (its own optimizer_step is taken: test_lightning_optimizer_step)
        def backward(self, loss, *args, **kwargs):
            raise AssertionError("not to be called")
    with pytest.raises(ValueError, match="the module overrides backward, Lightning's hooks deciding how a step "
                                         "trains, which fit does not call: give fit step="):
        dptrain.fit(OwnBackward(), data(), epochs=1, log=None)

    class Hooks(Lit):
        def on_validation_model_eval(self, *args):
            raise AssertionError("not called")

        def on_before_backward(self, loss):
            raise AssertionError("not called")
    lines = []
    dptrain.fit(Hooks(), data(), data(8), epochs=1, log=lines.append, devices=1)
    assert "dptrain: the module's on_validation_model_eval, on_before_backward (Lightning hooks) are not called: give " \
           "their work to a dptrain.Callback" in "\n".join(lines)

    class LightningModule(LightningLike):           # (Lightning's class: its hooks are not the user's)
        __module__ = "lightning.pytorch.core.module"

        def validation_step(self, batch, batch_idx):
            raise AssertionError("Lightning's own validation_step is not called")

        def on_validation_epoch_end(self):
            pass

    class Plain(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(6, 3)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch[0]), batch[1])
    lines = []
    dptrain.fit(Plain(), data(), data(8), epochs=1, log=lines.append, devices=1, optimizer=torch.optim.SGD)
    assert not any("Lightning hooks" in line or "validation_step evaluates" in line for line in lines)

    class NanoGPT(nn.Module):                        # a configure_optimizers of other arguments: not called
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(6, 3)

        def forward(self, x):
            return self.net(x)

        def configure_optimizers(self, weight_decay, learning_rate):
            raise AssertionError("not to be called")
    lines = []
    dptrain.fit(NanoGPT(), data(), epochs=1, log=lines.append, devices=1)
    assert any(line.startswith("dptrain: no optimizer given: SGD") for line in lines)
    model, lines = Lit(), []
    dptrain.fit(model, data(), epochs=1, log=lines.append, devices=1, loss=nn.CrossEntropyLoss(),
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert model.seen == [] and not any("LightningModule" in line for line in lines)


class TrainLogging(Lit):
    """A training_step as Lightning programs write it: its loss, a mean and a metric object logged."""

    def __init__(self):
        super().__init__()
        from torchmetrics.classification import MulticlassF1Score
        self.train_f1 = MulticlassF1Score(3, average="macro")

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)                    # (ours already: train_loss)
        self.log("train/acc", (logits.argmax(1) == y).float().mean(), on_epoch=True, prog_bar=True)
        self.train_f1(logits, y)
        self.log("train_f1", self.train_f1, on_epoch=True)
        return loss


def training_figures_by_hand(model, X, y, epochs=2, batch=16):
    """Each epoch's train_acc (a mean over its samples) and macro F1 of the logits each step
    trained on, in Lightning's automatic optimization by hand."""
    from torchmetrics.classification import MulticlassF1Score
    config = model.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    rows = []
    for _ in range(epochs):
        hits, f1 = 0.0, MulticlassF1Score(3, average="macro")
        for i in range(0, len(X), batch):
            logits = model(X[i:i + batch])
            loss = F.cross_entropy(logits, y[i:i + batch])
            hits += (logits.argmax(1) == y[i:i + batch]).sum().item()
            f1.update(logits.detach(), y[i:i + batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        rows.append({"train_acc": hits / len(X), "train_f1": f1.compute().item()})
    return rows


@pytest.mark.parametrize("devices", [1, 2])
def test_what_training_step_logs_is_each_epochs_figures_over_its_batches(devices, monkeypatch):
    """A logged mean counts its batch's samples, a logged metric object is computed over the
    epoch (each device's copy merged): the plain loop's figures, on any split (88 samples:
    a last batch of 8; the sums folded every 4 steps, not 32, so folded sums meet new means)."""
    from dptrain.engine.train_figures import TrainFigures
    monkeypatch.setattr(TrainFigures, "FOLD_EVERY", 4)
    torch.manual_seed(0)
    model = TrainLogging()
    expected = training_figures_by_hand(copy.deepcopy(model), *data(88))
    lines = []
    result = dptrain.fit(model, data(88), data(32, 1), epochs=2, batch_size=16, shuffle=False, devices=devices,
                         log=lines.append, progress=False)
    assert [{k: row[k] for k in ("train_acc", "train_f1")} for row in result["history"]] == [
        pytest.approx(row, rel=1e-5) for row in expected]
    assert "train_loss_count" not in result["history"][0] and "train_logged:acc" not in result["history"][0]
    assert lines[0].endswith("what they give self.log is each epoch's figures over its batches (train_acc; "
                             "val_acc: test_acc)")



def test_what_training_step_logs_is_recorded_without_an_evaluation_set():
    """Its names were learned only by the trial an evaluation set's first batch (or a lazy layer)
    made: without either, the logged train_acc and train_f1 were left out silently."""
    torch.manual_seed(0)
    model = TrainLogging()
    expected = training_figures_by_hand(copy.deepcopy(model), *data(88))
    result = dptrain.fit(model, data(88), epochs=2, batch_size=16, shuffle=False, devices=1, log=None,
                         progress=False)
    assert [{k: row[k] for k in ("train_acc", "train_f1")} for row in result["history"]] == [
        pytest.approx(row, rel=1e-5) for row in expected]


class WithTestStep(Logging):
    """A module with test_step and predict_step besides validation_step (Lightning's trainer.test
    and trainer.predict call them)."""

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.seen.append(("test", batch_idx))
        self.log("test_acc", (logits.argmax(1) == y).float().mean())
        self.log("test/top2", (logits.topk(2, 1).indices == y[:, None]).any(1).float().mean())
        return F.cross_entropy(logits, y)

    def predict_step(self, batch, batch_idx):
        x, _ = batch                        # (the batch as the loader gives it: its target too)
        return {"probs": self(x).softmax(1), "batch": torch.full((len(x),), batch_idx)}


@pytest.mark.parametrize("devices", [1, 2])
def test_evaluate_takes_test_step_and_predict_takes_predict_step(devices):
    torch.manual_seed(0)
    model = WithTestStep()
    X, y = data(40, 1)
    figures = dptrain.evaluate(model, (X, y), batch_size=16, devices=devices)
    with torch.no_grad():
        logits = model(X)
    expected = {"test_loss": F.cross_entropy(logits, y).item(),
                "test_acc": (logits.argmax(1) == y).float().mean().item(),
                "test_top2": (logits.topk(2, 1).indices == y[:, None]).any(1).float().mean().item()}
    assert figures == pytest.approx(expected, rel=1e-5)
    assert {kind for kind, _ in model.seen} == {"test"}      # (neither validation_step nor training_step)
    out = dptrain.predict(model, (X, y), batch_size=16, devices=devices)
    torch.testing.assert_close(out["probs"], logits.softmax(1))
    assert out["batch"].tolist() == [0] * 16 + [1] * 16 + [2] * 8


def test_a_name_first_logged_after_the_first_call_is_said_not_recorded():
    class Late(Lit):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)["loss"]
            self.log("train_first", loss)
            if batch_idx == 2:
                self.log("train/late", loss)
            return loss
    with pytest.warns(UserWarning, match=r"training_step logged 'train/late' first after its first call, whose names "
                                         r"are the figures kept: not recorded; log every name from the first call"):
        result = dptrain.fit(Late(), data(), epochs=2, batch_size=16, devices=1, log=None, progress=False)
    assert "train_first" in result["history"][1] and "train_late" not in result["history"][1]


def test_a_logged_metric_that_cannot_merge_its_copies_is_said_before_training():
    class Old(nn.Module):                           # (a torchmetrics older than 1.3: no merge_state)
        def update(self, *args):
            pass

        def compute(self):
            return torch.tensor(0.0)

        def reset(self):
            pass

    class Logs(Lit):
        def __init__(self):
            super().__init__()
            self.old = Old()

        def training_step(self, batch, batch_idx):
            self.log("train_old", self.old)
            return super().training_step(batch, batch_idx)
    model = Logs()
    with pytest.raises(TypeError, match="metric 'train_old' .Old. has no merge_state, which combines its copies on "
                                        "several devices: upgrade torchmetrics"):
        dptrain.fit(model, data(), epochs=1, devices=2, log=None)
    assert ("train", 0) not in model.seen           # (before the first step)
