"""dptrain.predict of a LightningModule calls its own hooks of the predict run as Lightning's trainer.predict
does (lightning_predict_hooks.py): the run's once a process on the module, the batch hooks around each device's
predict_step on its part, what they appended put together in order before on_predict_epoch_end."""
import pytest
import torch
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike


class Writes(LightningLike):
    """A BasePredictionWriter's habit in the module: each batch's classes kept, written at the end."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 3).double()
        self.classes, self.calls, self.written = [], [], None

    def predict_step(self, batch, batch_idx):
        return self.net(batch)

    def on_predict_start(self):
        self.calls.append("on_predict_start")

    def on_predict_epoch_start(self):
        self.calls.append("on_predict_epoch_start")

    def on_predict_batch_start(self, batch, batch_idx):
        self.calls.append(("batch_start", batch_idx, len(batch)))

    def on_predict_batch_end(self, outputs, batch, batch_idx):
        self.classes.append(outputs.argmax(1))
        self.calls.append(("batch_end", batch_idx, len(outputs)))

    def on_predict_epoch_end(self):
        self.written = torch.cat(self.classes)
        self.classes.clear()
        self.calls.append("on_predict_epoch_end")

    def on_predict_end(self):
        self.calls.append("on_predict_end")


@pytest.mark.parametrize("devices", [1, 2])
def test_the_predict_hooks_are_called_where_lightnings_trainer_calls_them(devices):
    X = torch.randn(40, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = Writes()
    out = dptrain.predict(model, X, batch_size=16, devices=devices)
    with torch.no_grad():
        torch.testing.assert_close(out, model.net(X))
    assert torch.equal(model.written, out.argmax(1))          # (every device's part, in the samples' order)
    parts = [(b, n // devices) for b, n in enumerate([16, 16, 8]) for _ in range(devices)]
    batch_calls = [c for c in model.calls if isinstance(c, tuple)]
    assert sorted(c for c in batch_calls if c[0] == "batch_start") == sorted(("batch_start",) + p for p in parts)
    assert sorted(c for c in batch_calls if c[0] == "batch_end") == sorted(("batch_end",) + p for p in parts)
    assert [c for c in model.calls if isinstance(c, str)] == ["on_predict_start", "on_predict_epoch_start",
                                                               "on_predict_epoch_end", "on_predict_end"]
    assert model.calls[:2] == ["on_predict_start", "on_predict_epoch_start"] and model.calls[-1] == "on_predict_end"


def test_a_forward_given_calls_no_hook():
    X = torch.randn(8, 4, dtype=torch.float64)
    model = Writes()
    dptrain.predict(model, X, batch_size=4, devices=1, forward=lambda m, x: m.net(x))
    assert model.calls == [] and model.written is None
