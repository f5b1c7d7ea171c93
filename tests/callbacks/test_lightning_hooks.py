"""What a LightningModule's hooks read of its trainer at the epoch's end: ``callback_metrics``
(and ``logged_metrics``), what the module logged, by its names, as Lightning's ``Trainer``
fills it (checked against Lightning 2.6 by hand: the same dicts at the same points)."""
import copy
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.lightning_logger import BoardLogger
from tests.engine.test_lightning_module import LightningLike, data
from tests.engine.test_lightning_trainer import EpochEnds


class Logging(LightningLike):
    """Logs a figure in each step; keeps what the first training step of an epoch reads in
    callback_metrics."""
    seen = []

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(6, 3)

    def forward(self, x):
        return self.net(x)

    def _keep(self, where):
        metrics = self.trainer.callback_metrics
        assert metrics is self.trainer.logged_metrics
        assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
        Logging.seen.append((where, self.current_epoch, {k: float(v) for k, v in metrics.items()}))

    def training_step(self, batch, batch_idx):
        logits = self(batch[0])
        self.log("train_acc", (logits.argmax(1) == batch[1]).float().mean(), on_epoch=True, on_step=False)
        if batch_idx == 0 and self.training and torch.is_grad_enabled():
            self._keep("step")
        return F.cross_entropy(logits, batch[1])

    def validation_step(self, batch, batch_idx):
        logits = self(batch[0])
        self.log("val_acc", (logits.argmax(1) == batch[1]).float().mean())
        self.log("val/ce", F.cross_entropy(logits, batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3)


class Reading(Logging):
    """... and logs a figure in on_validation_epoch_end; keeps what each epoch-end hook reads."""

    def on_validation_epoch_end(self):
        self._keep("val_end")
        self.log("val_epochs", float(self.current_epoch + 1))

    def on_train_epoch_end(self):
        self._keep("train_end")


@pytest.mark.parametrize("devices", [1, 2])
def test_callback_metrics_hold_the_latest_figures_by_the_logged_names(devices):
    Logging.seen.clear()
    result = dptrain.fit(Reading(), data(), data(40, 1), epochs=2, batch_size=16, devices=devices, log=None,
                         progress=False)
    rows = result["history"]
    evaluated = [{"val_acc": r["test_acc"], "val/ce": r["test_ce"]} for r in rows]
    after = [{**evaluated[e], "val_epochs": e + 1.0, "train_acc": r["train_acc"]} for e, r in enumerate(rows)]
    expected = [("step", 0, {}), ("val_end", 0, evaluated[0]), ("train_end", 0, after[0]),
                ("step", 1, after[0]),          # (the previous epoch's; the next evaluation's before its hook)
                ("val_end", 1, {**after[0], **evaluated[1]}), ("train_end", 1, after[1])]
    seen = [s for i, s in enumerate(Logging.seen) if s[0] != "step" or s not in Logging.seen[:i]]   # (each copy)
    assert [(w, e) for w, e, _ in seen] == [(w, e) for w, e, _ in expected]
    for (_, _, got), (_, _, want) in zip(seen, expected):
        assert got.keys() == want.keys()
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=1e-6)


def test_without_epoch_end_hooks_a_step_reads_the_previous_epochs_figures():
    Logging.seen.clear()
    result = dptrain.fit(Logging(), data(), data(40, 1), epochs=2, batch_size=16, devices=1, log=None, progress=False)
    first = result["history"][0]
    assert Logging.seen == [("step", 0, {}), ("step", 1, pytest.approx(
        {"val_acc": first["test_acc"], "val/ce": first["test_ce"], "train_acc": first["train_acc"]}, rel=1e-6))]


class Drawing(Logging):
    """Lightning's habit with a TensorBoard logger: an image and a figure of its own written to
    the logger's experiment at each epoch's end, and a file saved in its log_dir."""

    def on_validation_epoch_end(self):
        if self.logger is None:
            return
        self.logger.experiment.add_image("weights", self.net.weight.detach().unsqueeze(0), self.current_epoch)
        self.logger.log_metrics({"weight_norm": self.net.weight.norm()}, step=self.current_epoch)
        self.logger.log_hyperparams({"lr": 0.3})
        torch.save(self.state_dict(), os.path.join(self.trainer.log_dir, f"epoch{self.current_epoch}.pt"))


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")
def test_the_module_writes_to_the_runs_tensorboard_through_its_logger(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model = Drawing()
    result = dptrain.fit(model, data(), data(40, 1), epochs=2, batch_size=16, devices=2, log=None, progress=False,
                         tensorboard=str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "scalars": 0}).Reload()
    assert [e.step for e in events.Images("weights")] == [0, 1]
    assert [e.value for e in events.Scalars("weight_norm")][-1] == pytest.approx(model.net.weight.norm().item())
    assert [e.value for e in events.Scalars("test_acc")] == pytest.approx([r["test_acc"] for r in result["history"]])
    assert events.Tags()["tensors"] == ["hparams/text_summary"]         # (log_hyperparams: a text)
    assert sorted(os.listdir(tmp_path / "tb"))[:2] == ["epoch0.pt", "epoch1.pt"]
    assert dptrain.fit(Drawing(), data(), epochs=1, batch_size=16, devices=1, log=None)["history"]   # (no logger)


def test_a_process_other_than_rank_0s_writes_nothing():
    logger = BoardLogger(None, "runs/tb")
    assert logger.experiment.add_image("x", torch.zeros(1, 2, 2), 0) is logger.experiment
    logger.log_metrics({"a": torch.tensor(1.0)}, step=3)
    assert (logger.log_dir, logger.save_dir) == ("runs/tb", "runs/tb")


class EveryFourSteps(EpochEnds):
    """Lightning's val_check_interval habit: validation_step keeps its hits, on_validation_epoch_end
    logs their rate and clears them (each validation's own), on_validation_epoch_start counts."""
    starts = []

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("val_acc", self.hits[-1].mean())       # (over the set: its accuracy, as the hook's rate)

    def on_validation_epoch_start(self):
        EveryFourSteps.starts.append(self.global_step)


@pytest.mark.parametrize("devices", [1, 2])
def test_an_evaluation_every_n_steps_calls_the_validation_hooks_around_it(devices):
    EveryFourSteps.starts.clear()
    result = dptrain.fit(EveryFourSteps(), data(), data(40, 1), epochs=2, batch_size=16, devices=devices, log=None,
                         progress=False, eval_every_n_steps=4)
    steps = [row for row in result["step_history"] if "test_acc" in row]
    assert [row["step"] for row in steps] == [4, 8, 12]
    for row in steps + result["history"]:         # (each evaluation's rate over its own hits: its accuracy)
        assert row["test_rate"] == pytest.approx(row["test_acc"], rel=1e-6)
    assert EveryFourSteps.starts == [4, 6, 8, 12, 12]       # (the epochs' ends too: step 12's evaluated again)
    for row in result["history"]:                          # (every training batch's loss, once)
        assert row["train_step_loss"] == pytest.approx(row["train_loss"], rel=1e-5)


class Stopping(Logging):
    """Lightning's way for a module to end the run: ``self.trainer.should_stop = True`` (here in
    the step of update ``at``, or in on_validation_epoch_end once val_acc reaches ``enough``)."""
    trained = set()                                 # (the updates whose steps ran)

    def __init__(self, at=None, enough=None):
        super().__init__()
        self.at, self.enough = at, enough

    def training_step(self, batch, batch_idx):
        if self.training and torch.is_grad_enabled():
            Stopping.trained.add(self.global_step)
            if self.global_step == self.at:
                self.trainer.should_stop = True
        return super().training_step(batch, batch_idx)

    def on_validation_epoch_end(self):
        if self.enough is not None and self.trainer.callback_metrics["val_acc"] >= self.enough:
            self.trainer.should_stop = True


@pytest.mark.parametrize("devices", [1, 2])
def test_should_stop_set_by_the_module_ends_the_run(devices):
    lines = []
    Stopping.trained.clear()
    result = dptrain.fit(Stopping(at=7), data(), data(40, 1), epochs=5, batch_size=16, devices=devices,
                         log=lines.append, progress=False)
    assert [row["epoch"] for row in result["history"]] == [1, 2] and "test_acc" in result["history"][-1]
    assert Stopping.trained == set(range(8)) and any("the model set self.trainer.should_stop" in line for line in lines)
    result = dptrain.fit(Stopping(enough=0.0), data(), data(40, 1), epochs=5, batch_size=16, devices=devices,
                         log=None, progress=False)
    assert [row["epoch"] for row in result["history"]] == [1]       # (after the epoch whose hook set it)


class Momentum(LightningLike):
    """BYOL's and MoCo's habit: a target network following the online one after each update
    (``on_train_batch_end``), read by the loss; ``on_train_batch_start`` records what it is given."""
    given = []

    def __init__(self):
        super().__init__()
        self.online, self.target = nn.Linear(6, 3), nn.Linear(6, 3)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)

    def forward(self, x):
        return self.online(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        return F.cross_entropy(out, y) + F.mse_loss(out, self.target(x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.online.parameters(), lr=0.3)

    def on_train_batch_start(self, batch, batch_idx):
        Momentum.given.append((batch_idx, len(batch[0]), self.global_step))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        Momentum.given.append(("end", batch_idx, self.global_step, round(float(outputs["loss"]), 5), len(batch[0])))
        with torch.no_grad():
            for t, o in zip(self.target.parameters(), self.online.parameters()):
                t.mul_(0.5).add_(o, alpha=0.5)


@pytest.mark.parametrize("devices, settings", [(1, {}), (2, {}), (2, {"eval_every_n_steps": 4})])
def test_the_batch_hooks_are_called_around_each_batch_as_lightning_calls_them(devices, settings):
    torch.manual_seed(0)
    model = Momentum()
    expected = copy.deepcopy(model)
    opt = torch.optim.SGD(expected.online.parameters(), lr=0.3)
    X, y = data()
    losses = []
    for epoch in range(2):                      # (Lightning's automatic optimization, by hand)
        for i in range(0, len(X), 16):
            loss = expected.training_step((X[i:i + 16], y[i:i + 16]), i // 16)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            expected.on_train_batch_end({"loss": loss.detach()}, (X[i:i + 16], y[i:i + 16]), i // 16)
    Momentum.given.clear()
    dptrain.fit(model, data(), data(40, 1), epochs=2, batch_size=16, shuffle=False, devices=devices, log=None,
                progress=False, **settings)     # (an evaluation every 4 steps: between the hooks of its batch)
    for a, b in zip(model.state_dict().values(), expected.state_dict().values()):
        torch.testing.assert_close(a, b)                # (the target followed on every device's copy)
    steps = [(e * 6 + i) for e in range(2) for i in range(6)]
    assert [g for g in Momentum.given if g[0] != "end"] == [(s % 6, 16, s) for s in steps]
    ends = [g for g in Momentum.given if g[0] == "end"]
    assert [g[1:3] for g in ends] == [(s % 6, s + 1) for s in steps]
    assert [g[3] for g in ends] == pytest.approx(losses, abs=2e-5) and {g[4] for g in ends} == {16}


def test_what_the_batch_hooks_cannot_have_is_an_error_naming_the_way():
    class Skipping(Momentum):
        def on_train_batch_start(self, batch, batch_idx):
            return -1

    class ReadsPredictions(Momentum):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            outputs["preds"]
    with pytest.raises(ValueError, match=r"on_train_batch_start returned -1 \(Lightning: skip the epoch's other "
                                         r"batches\), which fit does not do: give fit max_batches=N"):
        dptrain.fit(Skipping(), data(), epochs=1, batch_size=16, devices=1, log=None)
    with pytest.raises(KeyError, match=r"outputs\['preds'\]: in on_train_batch_end, dptrain's outputs hold the "
                                       r"batch's loss alone"):
        dptrain.fit(ReadsPredictions(), data(), epochs=1, batch_size=16, devices=1, log=None)
    with pytest.raises(ValueError, match=r"on_train_batch_start and on_train_batch_end with accumulate_grad_batches=2"
                                         r": Lightning calls them on every micro-batch"):
        dptrain.fit(Momentum(), data(), epochs=1, batch_size=16, devices=1, log=None, accumulate_grad_batches=2)


def test_on_validation_start_and_end_wrap_each_evaluation_and_only_an_evaluated_epochs():
    """Lightning's order: on_validation_start, on_validation_epoch_start, ..., on_validation_epoch_end,
    on_validation_end, then on_train_epoch_end; an epoch not evaluated (eval_every=2) calls none of them."""
    calls = []

    class Around(Logging):
        def on_validation_start(self):
            calls.append(("start", self.current_epoch))

        def on_validation_epoch_start(self):
            calls.append(("epoch_start", self.current_epoch))

        def on_validation_epoch_end(self):
            calls.append(("epoch_end", self.current_epoch))

        def on_validation_end(self):
            calls.append(("end", self.current_epoch))

        def on_train_epoch_end(self):
            calls.append(("train_end", self.current_epoch))
    torch.manual_seed(0)
    dptrain.fit(Around(), data(), data(), epochs=4, eval_every=2, batch_size=32, devices=2, log=None, progress=False)
    def evaluated(e):
        return [("start", e), ("epoch_start", e), ("epoch_end", e), ("end", e)]
    assert calls == [("train_end", 0)] + evaluated(1) + [("train_end", 1), ("train_end", 2)] + evaluated(3) + \
        [("train_end", 3)]
