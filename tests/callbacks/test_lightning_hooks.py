"""What a LightningModule's hooks read of its trainer at the epoch's end: ``callback_metrics``
(and ``logged_metrics``), what the module logged, by its names, as Lightning's ``Trainer``
fills it (checked against Lightning 2.6 by hand: the same dicts at the same points)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike, data


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
