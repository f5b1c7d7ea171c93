"""Lightning's EMAWeightAveraging as fit runs it (callbacks/weight_averaging.py): the average, updated by
Lightning's rules, against torch's AveragedModel updated so in a plain loop."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

import dptrain
from dptrain.callbacks import LightningEMA
from tests.callbacks.test_peer_callbacks import peer
from tests.engine.test_lightning_module import LightningLike


def data(n=64):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long()


def made():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def plain(decay, every=1, from_step=None, from_epoch=None, epochs=3):
    """Lightning's WeightAveraging by hand: AveragedModel (buffers too), updated after each step whose index
    passes, and after each epoch from ``from_epoch``; each epoch's loss on the average; the model ends holding it."""
    model, (X, y) = made(), data()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    average = AveragedModel(model, use_buffers=True, avg_fn=get_ema_avg_fn(decay))
    losses, step = [], 0
    for epoch in range(epochs):
        for b in range(4):
            F.cross_entropy(model(X[b * 16:(b + 1) * 16]), y[b * 16:(b + 1) * 16]).backward()
            opt.step()
            opt.zero_grad()
            if (from_step is None or step >= from_step) and step % every == 0:
                average.update_parameters(model)
            step += 1
        with torch.no_grad():
            losses.append(float(F.cross_entropy(average.module(X), y)))
        if from_epoch is not None and epoch >= from_epoch:
            average.update_parameters(model)
    return average.module, losses


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("settings", [{"decay": 0.9}, {"decay": 0.8, "update_every_n_steps": 2, "update_starting_at_step": 3},
                                      {"decay": 0.7, "update_starting_at_epoch": 1}])
def test_the_average_and_its_evaluations_are_lightnings(settings, devices):
    want, losses = plain(settings["decay"], settings.get("update_every_n_steps", 1),
                         settings.get("update_starting_at_step"), settings.get("update_starting_at_epoch"))
    model = made()
    result = dptrain.fit(model, data(), data(), epochs=3, batch_size=16, devices=devices, shuffle=False, lr=0.5,
                         optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
                         callbacks=[LightningEMA(**settings)], log=None, progress=False)
    assert [row["test_loss"] for row in result["history"]] == pytest.approx(losses, rel=1e-12)
    for got, expected in zip(model.state_dict().values(), want.state_dict().values()):    # (the model holds it)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


class Lit(LightningLike):
    def __init__(self):
        super().__init__()
        self.net = made()

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)


def lightnings(decay=0.9, **more):
    """Lightning 2.6's EMAWeightAveraging as it keeps its settings."""
    kept = {"_kwargs": {"avg_fn": get_ema_avg_fn(decay)}, "_use_buffers": True, "_device": None,
            "update_every_n_steps": 1, "update_starting_at_step": None, "update_starting_at_epoch": None}
    kept.update(more)
    return peer("lightning.pytorch.callbacks.weight_averaging", "EMAWeightAveraging", **kept)


def test_lightnings_callback_runs_as_lightning_ema_and_the_line_says_so():
    want, losses = plain(0.9)
    model, lines = Lit(), []
    result = dptrain.fit(model, data(), data(), epochs=3, batch_size=16, devices=2, shuffle=False,
                         callbacks=[lightnings(0.9)], log=lines.append, progress=False)
    assert [row["test_loss"] for row in result["history"]] == pytest.approx(losses, rel=1e-12)
    torch.testing.assert_close(model.net[0].weight, want[0].weight, rtol=1e-12, atol=1e-12)
    assert any("lightning's EMAWeightAveraging runs as dptrain.callbacks.LightningEMA(decay=0.9) (every evaluation "
               "on the average" in line for line in lines)
    with pytest.raises(TypeError, match="give fit callbacks=\\[ema := dptrain.callbacks.EMA"):     # (not its settings)
        dptrain.fit(Lit(), data(), epochs=1, batch_size=16, callbacks=[lightnings(_use_buffers=False)], log=None,
                    progress=False)
