"""A LightningModule's configure_callbacks() adds to fit's callbacks as Lightning's Trainer adds
them (lightning_adopt.with_module_callbacks)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.callbacks import EarlyStopping
from tests.callbacks.test_peer_callbacks import lightning_early_stopping


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g)
    return X, (X[:, 0] > 0).long(), torch.randint(0, 2, (64,), generator=g)   # (noisy labels to evaluate on)


class Seen(dptrain.Callback):
    """Which epochs it saw end, under its name."""

    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    def on_epoch_end(self, run, epoch, logs):
        self.seen.append((self.name, epoch))


class Other(Seen):
    pass


class WithCallbacks(nn.Module):
    """A LightningModule's shape whose configure_callbacks gives ``theirs``."""

    def __init__(self, theirs):
        super().__init__()
        torch.manual_seed(0)
        self.net, self.theirs = nn.Linear(4, 2), theirs

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def configure_callbacks(self):
        return self.theirs() if callable(self.theirs) else self.theirs


def run(theirs, callbacks=(), lines=None):
    X, y, noisy = data()
    model = WithCallbacks(theirs)
    result = dptrain.fit(model, (X, y), (X, noisy), callbacks=list(callbacks), epochs=12, batch_size=16, devices=2,
                         progress=False, log=lines.append if lines is not None else None)
    return model, result


@pytest.mark.parametrize("theirs", [lambda: [EarlyStopping("val_loss", patience=2)],
                                    lambda: EarlyStopping("val_loss", patience=2),              # (one, not a list)
                                    lambda: [lightning_early_stopping("val_loss", patience=2)]])  # (Lightning's)
def test_the_modules_callbacks_run_as_if_given_to_fit(theirs):
    lines = []
    model, result = run(theirs, lines=lines)
    want_model, want = run(None, callbacks=[EarlyStopping("val_loss", patience=2)])
    assert len(result["history"]) == len(want["history"]) < 12
    assert torch.equal(model.net.weight, want_model.net.weight)
    assert "dptrain: the module's configure_callbacks() gave EarlyStopping, added to fit's callbacks" in lines


def test_one_callback_given_to_fit_not_in_a_list_is_replaced_alike():
    X, y, noisy = data()
    result = dptrain.fit(WithCallbacks(lambda: [EarlyStopping("val_loss", patience=2)]), (X, y), (X, noisy),
                         callbacks=EarlyStopping("val_loss", patience=50), epochs=12, batch_size=16, devices=1,
                         progress=False, log=None)
    assert len(result["history"]) < 12


def test_they_take_the_place_of_fits_of_their_class_and_its_bases_not_of_the_base_callback():
    seen, lines = [], []
    model, result = run(lambda: [EarlyStopping("val_loss", patience=2), Other("module", seen)],
                        callbacks=[EarlyStopping("val_loss", patience=50), Seen("fit's Seen", seen),
                                   dptrain.Callback()], lines=lines)
    epochs = len(result["history"])
    assert epochs < 12                                  # (patience=2: the module's, not fit's 50)
    # fit's Seen is a base of the module's Other: replaced, as Lightning's Trainer replaces it
    assert seen == [("module", e) for e in range(1, epochs + 1)]
    assert ("dptrain: the module's configure_callbacks() gave EarlyStopping, Other, added to fit's callbacks in "
            "place of its EarlyStopping, Seen (Lightning's way)") in lines
    seen.clear()
    run(lambda: [Seen("module", seen)], callbacks=[Other("fit's Other", seen)])   # (a subclass of theirs stays)
    assert {name for name, _ in seen} == {"module", "fit's Other"}


@pytest.mark.parametrize("theirs", [None, []])
def test_none_given_leaves_fits_callbacks(theirs):
    seen, lines = [], []
    run(theirs, callbacks=[Seen("fit's", seen)], lines=lines)
    assert len(seen) == 12 and not any("configure_callbacks" in line for line in lines)
