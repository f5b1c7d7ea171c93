"""What a LightningModule's steps keep for its epoch-end hooks, put together over the devices'
copies: every copy's items in the batches' order, the metric objects merged."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.kept_outputs import held_lists, interleaved, outputs_kept
from tests.engine.test_lightning_module import LightningLike, data
from tests.engine.test_lightning_trainer import twins


def test_the_items_of_each_call_come_in_turn_and_a_copy_appending_unevenly_comes_after_the_other():
    assert interleaved([[1, 2, 5, 6], [3, 4, 7, 8]], [2, 2]) == [1, 2, 3, 4, 5, 6, 7, 8]     # two items a call
    assert interleaved([["a0", "a1", "a2"], ["b0", "b1"], []], [3, 2, 0]) == ["a0", "b0", "a1", "b1", "a2"]
    assert interleaved([[1, 2, 3], [4]], [2, 2]) == [1, 2, 3, 4]         # (an item on some calls only)


def test_the_lists_held_are_attributes_and_dict_values_and_not_a_metrics_states():
    from torchmetrics.classification import BinaryAUROC
    module = nn.Sequential(nn.Linear(2, 2))
    module.outs, module.by = [1], {"preds": [2], "n": 3}
    module[0].inner = []
    module.auc = BinaryAUROC()                  # (its states are lists, merged as a metric's)
    module.auc.update(torch.tensor([0.3, 0.8]), torch.tensor([0, 1]))
    assert [key for key, _ in held_lists(module, in_metrics=False)] == [":outs", ":by['preds']", "0:inner"]
    with outputs_kept(module):
        module.outs.append(4)
        module.auc.update(torch.tensor([0.9, 0.1]), torch.tensor([0, 1]))
    assert module.outs == [1] and module.auc.compute().item() == 1     # (the call's item and update dropped)


class KeptApart(LightningLike):
    """What each device's copy keeps, put together for the epoch-end hooks: a list of each
    sample's loss, a dict of lists, and a metric object the steps update and a hook computes."""
    seen = []

    def __init__(self):
        super().__init__()
        from torchmetrics.classification import MulticlassAccuracy
        self.net = nn.Linear(6, 3)
        self.losses, self.kept = [], {"preds": [], "labels": []}
        self.train_acc = MulticlassAccuracy(3, average="micro")

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        logits = self(batch[0])
        losses = F.cross_entropy(logits, batch[1], reduction="none")
        self.losses.append(losses.detach())
        self.train_acc.update(logits.detach(), batch[1])
        return losses.mean()

    def validation_step(self, batch, batch_idx):
        self.kept["preds"].append(self(batch[0]).argmax(1))
        self.kept["labels"].append(batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)

    def on_validation_epoch_end(self):
        labels = torch.cat(self.kept["labels"])
        KeptApart.seen.append(labels)
        self.log("val_rate", (torch.cat(self.kept["preds"]) == labels).float().mean())
        self.kept = {"preds": [], "labels": []}         # (a new dict: the copies keep theirs)

    def on_train_epoch_end(self):
        losses = torch.cat(self.losses)
        KeptApart.seen.append(losses)
        self.log("train_sample_loss", losses.mean())
        self.log("train_hits", self.train_acc.compute())
        self.train_acc.reset()
        self.losses.clear()


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_on_several_devices_the_epoch_end_hooks_read_what_every_copy_kept_in_the_batches_order(devices):
    model, expected = twins(KeptApart)
    opt = torch.optim.SGD(expected.parameters(), lr=0.2)
    (X, y), (Xv, yv) = data(), data(30, 1)
    want, seen = [], []
    for _ in range(2):
        losses, hits = [], 0
        for i in range(0, len(X), 16):
            logits = expected(X[i:i + 16])
            loss = F.cross_entropy(logits, y[i:i + 16], reduction="none")
            losses.append(loss.detach())
            hits += (logits.argmax(1) == y[i:i + 16]).sum().item()
            opt.zero_grad()
            loss.mean().backward()
            opt.step()
        with torch.no_grad():
            rate = (expected(Xv).argmax(1) == yv).float().mean().item()
        want.append((rate, torch.cat(losses).mean().item(), hits / len(X)))
        seen += [yv, torch.cat(losses)]
    KeptApart.seen.clear()
    result = dptrain.fit(model, (X, y), (Xv, yv), epochs=2, batch_size=16, shuffle=False,
                         devices=devices, log=None)
    assert [(row["test_rate"], row["train_sample_loss"], row["train_hits"]) for row in result["history"]] == [
        pytest.approx(w, rel=1e-5) for w in want]
    assert len(KeptApart.seen) == len(seen)
    for got, expected_items in zip(KeptApart.seen, seen):         # every item, in the batches' order
        torch.testing.assert_close(got, expected_items)
    assert model.losses == [] and model.kept == {"preds": [], "labels": []}


class Accumulating(KeptApart):
    """Its metric object counts over the whole run (the hook never resets it)."""

    def on_train_epoch_end(self):
        self.log("train_hits", self.train_acc.compute())
        self.losses.clear()


def test_a_metrics_state_from_before_fit_is_counted_once_on_several_devices():
    hits = []
    for devices in (1, 2):
        model, _ = twins(Accumulating)
        model.train_acc.update(torch.eye(3)[[0, 1, 1, 2]], torch.tensor([0, 1, 2, 2]))    # 3 of 4 right
        result = dptrain.fit(model, data(), epochs=2, batch_size=16, shuffle=False, devices=devices, log=None)
        hits.append([row["train_hits"] for row in result["history"]])
    assert hits[1] == pytest.approx(hits[0], rel=1e-6)
