"""A LightningModule's own on_after_batch_transfer changes each batch on its device, the stage its
trainer says deciding what (lightning_transfer.py): Lightning's augmentation on the GPU."""
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


class Augmented(LightningLike):
    """Lightning's documented hook: the batch changed on its device when training (here x * 2,
    so that the plain loop can do the same), and x * 3 when predicting. ``calls``: every device's
    copy's calls (a class attribute: the copies share it)."""
    calls = []

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2).double()
        Augmented.calls = []

    def forward(self, x):
        return self.net(x)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        t = self.trainer
        Augmented.calls.append((t.training, t.validating, t.testing, t.predicting, dataloader_idx, len(batch[0])))
        if t.predicting:
            return batch * 3
        x, y = batch
        return (x * 2 if t.training else x), y

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def plain():
    """The same training in a plain loop, each training batch's x doubled."""
    model, (X, y) = Augmented(), data()
    opt = model.configure_optimizers()
    for epoch in range(2):
        for b in range(4):
            F.cross_entropy(model(X[b * 16:(b + 1) * 16] * 2), y[b * 16:(b + 1) * 16]).backward()
            opt.step()
            opt.zero_grad()
    with torch.no_grad():
        return model, float(F.cross_entropy(model(X), y))


@pytest.mark.parametrize("devices", [1, 2])
def test_the_hook_augments_training_batches_only_as_lightnings_trainer_says(devices):
    want, val_loss = plain()
    model = Augmented()
    result = dptrain.fit(model, data(), data(), epochs=2, batch_size=16, devices=devices, shuffle=False, log=None,
                         progress=False)
    torch.testing.assert_close(model.net.weight, want.net.weight, rtol=1e-10, atol=1e-10)
    assert result["history"][-1]["test_loss"] == pytest.approx(val_loss, rel=1e-10)
    training = [c for c in model.calls if c[0]]
    assert len(training) == 2 * 4 * devices                       # each device's part of each batch
    assert set(training) == {(True, False, False, False, 0, 16 // devices)}
    assert (False, True, False, False, 0, 16 // devices) in model.calls      # (the evaluation's batches: validating)
    assert model._trainer is None                                 # (its stand-in gone after fit)


@pytest.mark.parametrize("devices", [1, 2])
def test_evaluate_and_predict_say_their_stage(devices):
    model = Augmented()
    X, y = data()
    scores = dptrain.evaluate(model, (X, y), batch_size=16, devices=devices)
    with torch.no_grad():
        assert scores["test_loss"] == pytest.approx(float(F.cross_entropy(model(X), y)), rel=1e-10)   # (x as it is)
    assert {c[:5] for c in model.calls} == {(False, False, True, False, 0)}       # (and a trial's sample, first)
    assert [c[5] for c in model.calls].count(16 // devices) == 4 * devices
    model.calls.clear()
    out = dptrain.predict(model, X, batch_size=16, devices=devices)
    with torch.no_grad():
        torch.testing.assert_close(out, model(X * 3))                         # (its predicting branch)
    assert set(model.calls) == {(False, False, False, True, 0, 4)} and model._trainer is None   # (a row of X: 4)


class Data:
    """A LightningDataModule's shape with its own on_after_batch_transfer (Lightning takes it first)."""
    __module__ = "mine"

    def __init__(self):
        self.trainer, self.calls = None, []

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=16)

    val_dataloader = test_dataloader = train_dataloader

    def predict_dataloader(self):
        return torch.utils.data.DataLoader(data()[0], batch_size=16)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        t = self.trainer
        self.calls.append((t.training, t.validating, t.testing, t.predicting))
        if t.predicting:
            return batch * 3
        x, y = batch
        return (x * 2 if t.training else x), y


class ModuleHookToo(Augmented):
    def on_after_batch_transfer(self, batch, dataloader_idx):
        raise AssertionError("the data module's is taken")


def test_a_data_modules_hook_is_taken_first_in_fit_evaluate_and_predict():
    want, val_loss = plain()
    model, dm = ModuleHookToo(), Data()
    result = dptrain.fit(model, dm, epochs=2, devices=2, shuffle=False, log=None, progress=False)
    torch.testing.assert_close(model.net.weight, want.net.weight, rtol=1e-10, atol=1e-10)
    assert result["history"][-1]["test_loss"] == pytest.approx(val_loss, rel=1e-10)
    assert (True, False, False, False) in dm.calls and (False, True, False, False) in dm.calls
    dm.calls.clear()
    X, y = data()
    assert dptrain.evaluate(model, dm, devices=2)["test_loss"] == pytest.approx(val_loss, rel=1e-10)
    assert set(dm.calls) == {(False, False, True, False)}
    dm.calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(dptrain.predict(model, dm, devices=2), model(X * 3))
    assert set(dm.calls) == {(False, False, False, True)}


def test_a_data_modules_hooks_fit_does_not_call_are_named():
    class Before(Data):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            raise AssertionError("not called")
    lines = []
    dptrain.fit(Augmented(), Before(), epochs=1, devices=1, log=lines.append, progress=False)
    assert any("the data module's on_before_batch_transfer (Lightning hooks) are not called" in line for line in lines)
