"""A LightningModule's own on_save_checkpoint and on_load_checkpoint keep its own entries in the run's
checkpoint (callbacks/lightning_checkpoint_hooks.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g)
    return X, (X[:, 0] > 0).long()


class Queue(LightningLike):
    """Keeps, by hand, what is neither a parameter nor a buffer: each epoch's end and a running mean."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net, self.ends, self.mean, self.saves = nn.Linear(4, 2), [], torch.zeros(2), 0

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def on_train_epoch_end(self):
        self.ends.append((self.current_epoch, self.global_step))
        self.mean = 0.5 * self.mean + 0.5 * self.net.bias.detach()

    def on_save_checkpoint(self, checkpoint):
        self.saves += 1
        checkpoint["ends"], checkpoint["mean"] = list(self.ends), self.mean.clone()

    def on_load_checkpoint(self, checkpoint):
        self.ends, self.mean = list(checkpoint["ends"]), checkpoint["mean"].clone()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3)


def train(model, epochs, devices, **settings):
    lines = []
    dptrain.fit(model, data(), epochs=epochs, batch_size=16, devices=devices, progress=False, log=lines.append,
                **settings)
    return lines


@pytest.mark.parametrize("devices", [1, 2])
def test_a_resumed_run_gets_back_what_the_module_kept(tmp_path, devices):
    unbroken = Queue()
    train(unbroken, 4, devices)
    first = Queue()
    lines = train(first, 2, devices, checkpoint_dir=str(tmp_path))
    assert first.saves == 2                         # (a checkpoint each epoch)
    assert any("the module's on_save_checkpoint and on_load_checkpoint keep its own entries" in line for line in lines)
    again = Queue()
    train(again, 4, devices, checkpoint_dir=str(tmp_path), resume=True)
    assert again.ends == unbroken.ends == [(e, 4 * (e + 1)) for e in range(4)]
    torch.testing.assert_close(again.mean, unbroken.mean)
    torch.testing.assert_close(again.net.weight, unbroken.net.weight)


def test_a_hook_reading_lightnings_own_entries_is_told_fit_keeps_them(tmp_path):
    class ReadsWeights(Queue):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["state_dict"].pop("net.weight")
    with pytest.raises(KeyError, match="'state_dict': fit gives the module's on_save_checkpoint and "
                                       "on_load_checkpoint a dict of the module's own entries only"):
        train(ReadsWeights(), 1, 1, checkpoint_dir=str(tmp_path))


def test_only_on_load_checkpoint_gets_an_empty_dict_on_resume(tmp_path):
    got = []

    class LoadOnly(LightningLike):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(4, 2)
        training_step, configure_optimizers = Queue.training_step, Queue.configure_optimizers

        def on_load_checkpoint(self, checkpoint):
            got.append(dict(checkpoint))
    train(LoadOnly(), 1, 1, checkpoint_dir=str(tmp_path))
    assert got == []
    train(LoadOnly(), 2, 1, checkpoint_dir=str(tmp_path), resume=True)
    assert got == [{}]
