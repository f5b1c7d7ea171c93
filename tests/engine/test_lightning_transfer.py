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
    class Moves(Data):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            raise AssertionError("not called")
    lines = []
    dptrain.fit(Augmented(), Moves(), epochs=1, devices=1, log=lines.append, progress=False)
    assert any("the data module's transfer_batch_to_device (Lightning hooks) are not called: fit moves each device's "
               "part itself" in line for line in lines)


def scaled(n=64):
    """Images as a loader gives them: uint8, which on_before_batch_transfer makes float (x / 255)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randint(0, 256, (n, 4), generator=g, dtype=torch.uint8)
    return X, (X[:, 0] > 127).long()


class Scaled(LightningLike):
    """Lightning's documented CPU-side hook: the batch made float before it moves. ``calls``: (stage, samples)."""
    calls = []

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2).double()
        Scaled.calls = []

    def forward(self, x):
        return self.net(x)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        t = self.trainer
        Scaled.calls.append(("train" if t.training else "validate" if t.validating else "test" if t.testing
                             else "predict", len(batch[0]) if isinstance(batch, (tuple, list)) else len(batch)))
        if t.predicting:
            return batch.double() / 255
        x, y = batch
        return x.double() / 255, y

    def training_step(self, batch, batch_idx):
        Scaled.seen = batch[0].dtype
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


@pytest.mark.parametrize("devices, accumulate", [(1, 1), (2, 1), (2, 2)])
def test_the_before_hook_changes_each_process_batch_before_it_is_cut(devices, accumulate):
    X, y = scaled()
    want = Scaled()
    opt = want.configure_optimizers()
    for epoch in range(2):
        for b in range(0, 4, accumulate):           # (accumulated: one update of two batches' mean)
            loss = sum(F.cross_entropy(want(X[k * 16:(k + 1) * 16].double() / 255), y[k * 16:(k + 1) * 16])
                       for k in range(b, b + accumulate)) / accumulate
            loss.backward()
            opt.step()
            opt.zero_grad()
    model = Scaled()
    result = dptrain.fit(model, (X, y), (X, y), epochs=2, batch_size=16, devices=devices, shuffle=False, log=None,
                         progress=False, accumulate_grad_batches=accumulate)
    torch.testing.assert_close(model.net.weight, want.net.weight, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        assert result["history"][-1]["test_loss"] == pytest.approx(
            float(F.cross_entropy(want(X.double() / 255), y)), rel=1e-10)
    training = [c for c in model.calls if c[0] == "train"]
    assert training.count(("train", 16)) == 2 * 4 and Scaled.seen == torch.float64     # once a process batch
    assert ("validate", 16) in model.calls                  # (each evaluation batch, whole)
    model.calls.clear()
    dptrain.evaluate(model, (X, y), batch_size=32, devices=devices)
    assert model.calls.count(("test", 32)) == 2
    model.calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(dptrain.predict(model, X, batch_size=32, devices=devices), model(X.double() / 255))
    assert model.calls == [("predict", 32)] * 2 and model._trainer is None


def test_a_before_hook_changing_the_batchs_samples_is_an_error_naming_why():
    class Halves(Scaled):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            x, y = batch
            return x[: len(x) // 2].double(), y[: len(y) // 2]
    # (told on the trial's one-sample batch, before any training)
    with pytest.raises(ValueError, match="on_before_batch_transfer gave a batch of 0 samples for one of 1: fit reads, "
                                         "counts and splits each batch as its loader gives it"):
        dptrain.fit(Halves(), scaled(), epochs=1, batch_size=16, devices=1, log=None, progress=False)
