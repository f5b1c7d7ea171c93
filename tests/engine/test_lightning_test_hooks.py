"""dptrain.evaluate of a LightningModule calls its own hooks of the test run as Lightning's trainer.test does
(lightning_test_hooks.py): on_test_epoch_end over what every device's copy kept, its figures evaluate's."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike


def data(n=64):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long()


class TestHooks(LightningLike):
    """on_test_epoch_end logs the rate and count of the hits the steps kept. ``calls``: the hooks'."""
    __test__ = False

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2).double()
        self.hits, self.calls = [], []

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def on_test_start(self):
        self.calls.append(("on_test_start", self.trainer.testing))

    def on_test_epoch_start(self):
        self.calls.append(("on_test_epoch_start",))

    def on_test_epoch_end(self):
        hits = torch.cat(self.hits)
        self.log("test_hit_rate", hits.double().mean())
        self.log("test_seen", float(len(hits)))
        self.calls.append(("on_test_epoch_end", float(self.trainer.callback_metrics["test_loss"])))
        self.hits.clear()

    def on_test_end(self):
        self.calls.append(("on_test_end",))


class Tested(TestHooks):
    """test_step keeps each batch's hits."""

    def test_step(self, batch, batch_idx):
        self.hits.append(self.net(batch[0]).argmax(1) == batch[1])
        self.log("test_loss", F.cross_entropy(self.net(batch[0]), batch[1]))


@pytest.mark.parametrize("devices", [1, 2])
def test_on_test_epoch_end_reads_what_every_devices_copy_kept_and_its_figures_are_evaluates(devices):
    model = Tested()
    X, y = data()
    scores = dptrain.evaluate(model, (X, y), batch_size=16, devices=devices)
    with torch.no_grad():
        hits = model.net(X).argmax(1) == y
        loss = float(F.cross_entropy(model.net(X), y))
    assert scores["test_hit_rate"] == pytest.approx(float(hits.double().mean()), rel=1e-12)
    assert scores["test_seen"] == 64                 # (every device's part; the one-sample check's left out)
    assert scores["test_loss"] == pytest.approx(loss, rel=1e-10)
    assert [c[0] for c in model.calls] == ["on_test_start", "on_test_epoch_start", "on_test_epoch_end", "on_test_end"]
    assert model.calls[0][1] is True and model.calls[2][1] == pytest.approx(loss, rel=1e-6)  # (callback_metrics: float32)
    assert model.hits == [] and model._trainer is None


class Validated(TestHooks):
    """No test_step: evaluate runs validation_step, and the validation hooks around it (trainer.validate's)."""

    def validation_step(self, batch, batch_idx):
        self.hits.append(self.net(batch[0]).argmax(1) == batch[1])

    def on_validation_epoch_end(self):
        self.log("val_hit_rate", torch.cat(self.hits).double().mean())
        self.hits.clear()


def test_a_module_evaluated_by_its_validation_step_gets_the_validation_hooks():
    model = Validated()
    X, y = data()
    scores = dptrain.evaluate(model, (X, y), batch_size=16, devices=2)
    with torch.no_grad():
        rate = float((model.net(X).argmax(1) == y).double().mean())
    assert scores["test_hit_rate"] == pytest.approx(rate, rel=1e-12) and model.calls == []    # (the test hooks: not)
