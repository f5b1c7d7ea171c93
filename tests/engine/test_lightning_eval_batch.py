"""A LightningModule's own on_validation_batch_start/end (on_test_batch_* in evaluate) run around
each device's step, with its part and its outputs (lightning_eval_batch.py): what they log and keep
is the step's, over the whole set."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike


def data(n=48):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return X, (X[:, 1] > 0).long()


class Hooked(LightningLike):
    """validation_step returns its probabilities; on_validation_batch_end keeps them (read by
    on_validation_epoch_end) and logs their top value's mean. ``calls``: every copy's, in turn."""
    calls = []

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2).double()
        self.probs = []
        Hooked.calls = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        logits = self(batch[0])
        return {"loss": F.cross_entropy(logits, batch[1]), "probs": logits.softmax(1)}

    def on_validation_batch_start(self, batch, batch_idx):
        if not self.trainer.sanity_checking:            # (Lightning's check before training runs them too)
            Hooked.calls.append(("start", batch_idx, len(batch[0])))

    def on_validation_batch_end(self, outputs, batch, batch_idx):
        Hooked.calls.append(("end", batch_idx, len(outputs["probs"])))
        self.probs.append(outputs["probs"])
        self.log("val_conf", outputs["probs"].max(1).values.mean())

    def on_validation_epoch_end(self):
        probs = torch.cat(self.probs)
        self.log("val_seen", float(len(probs)))
        self.log("val_first", probs[0, 1])
        self.probs.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


@pytest.mark.parametrize("devices", [1, 2])
def test_the_hooks_see_each_devices_part_and_what_they_keep_is_the_whole_sets(devices):
    model = Hooked()
    lines = []
    result = dptrain.fit(model, data(), data(), epochs=1, batch_size=16, devices=devices, shuffle=False,
                         log=lines.append, progress=False)
    X, y = data()
    with torch.no_grad():
        probs, loss = model(X).softmax(1), F.cross_entropy(model(X), y)
    row = result["history"][-1]
    assert row["test_conf"] == pytest.approx(float(probs.max(1).values.mean()), rel=1e-10)
    assert row["test_seen"] == 48                                     # every part, put together for the hook
    assert row["test_first"] == pytest.approx(float(probs[0, 1]), rel=1e-10)     # ... in the batches' order
    assert row["test_loss"] == pytest.approx(float(loss), rel=1e-10)
    part = 16 // devices
    assert Hooked.calls[0] == ("end", 0, 1)     # the evaluation set's one-sample check (sanity_checking)
    assert sorted(Hooked.calls[1:]) == sorted([("start", b, part) for b in range(3) for _ in range(devices)]
                                              + [("end", b, part) for b in range(3) for _ in range(devices)])
    assert model.probs == []
    assert any("on_validation_batch_start and on_validation_batch_end run around validation_step on each "
               "device's copy" in line for line in lines)


class Tested(Hooked):
    __test__ = False

    def test_step(self, batch, batch_idx):
        out = self.validation_step(batch, batch_idx)
        self.log("test_loss", out["loss"])
        return out

    def on_test_batch_end(self, outputs, batch, batch_idx):
        Hooked.calls.append(("test_end", batch_idx, len(outputs["probs"]), self.trainer.testing,
                             self.trainer.sanity_checking))
        self.log("test_conf", outputs["probs"].max(1).values.mean())


def evaluated(model, devices):
    """``dptrain.evaluate`` of ``model``: its test_conf is the mean top probability over the whole set."""
    X, y = data()
    scores = dptrain.evaluate(model, (X, y), batch_size=16, devices=devices)
    with torch.no_grad():
        probs = model(X).softmax(1)
    assert scores["test_conf"] == pytest.approx(float(probs.max(1).values.mean()), rel=1e-10)


def test_evaluate_calls_the_test_hooks_around_test_step():
    model = Tested()
    evaluated(model, 2)
    ends = [c for c in Hooked.calls if c[0] == "test_end"]
    assert ends[0] == ("test_end", 0, 1, True, True)        # (the one-sample check first)
    assert sorted(ends[1:]) == sorted(("test_end", b, 8, True, False) for b in range(3) for _ in range(2))
    assert model._trainer is None                            # (its stand-in gone after evaluate)
    assert not [c for c in Hooked.calls if c[0] in ("start", "end")]      # (validation's: not when testing)


def test_evaluate_of_a_validation_step_calls_the_validation_hooks():
    model = Hooked()
    evaluated(model, 1)
    assert [c for c in Hooked.calls if c[0] == "end"][-3:] == [("end", b, 16) for b in range(3)]


def test_the_parts_outputs_are_joined_as_one_step_on_the_whole_batch_gives_them():
    from dptrain.engine.lightning_eval_batch import joined
    g = torch.Generator().manual_seed(0)
    probs, loss = torch.rand(10, 3, generator=g, dtype=torch.float64), torch.rand(10, generator=g, dtype=torch.float64)
    sizes = [4, 3, 3]
    parts = [{"probs": p, "loss": l.mean(), "n": float(len(p)), "name": "val", "pair": (p[:, 0], l),
              "correct": (p[:, 0] > 0.5).sum(), "seen": len(p)}
             for p, l in zip(probs.split(sizes), loss.split(sizes))]
    out = joined(parts, sizes)
    torch.testing.assert_close(out["probs"], probs)
    torch.testing.assert_close(out["loss"], loss.mean(), rtol=1e-12, atol=0)      # (each part's mean, weighed)
    assert out["n"] == pytest.approx(sum(n * n for n in sizes) / 10) and out["name"] == "val"
    assert out["correct"] == (probs[:, 0] > 0.5).sum() and out["seen"] == 10       # (integers: counts, summed)
    torch.testing.assert_close(out["pair"][0], probs[:, 0])
    assert isinstance(out["pair"], tuple) and joined([None, None], [2, 2]) is None
    assert joined([parts[0]], [4]) is parts[0]                         # (one device: as it gave them)
    with pytest.raises(TypeError, match=r"these parts cannot be joined \(str\): return per-sample tensors"):
        joined(["a", "b"], [2, 2])
    with pytest.raises(TypeError, match="cannot be joined"):         # (a tensor whose rows are not the samples)
        joined([torch.zeros(3, 2), torch.zeros(3, 2)], [2, 2])
