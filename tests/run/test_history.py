"""``result["history"]``: the rows as a list, and each figure over the epochs by name, as
Keras's ``history.history["val_loss"]`` reads them."""
import json
import math

import pytest
import torch
from torch import nn

import dptrain
from dptrain.run.history import History


def test_a_figure_by_our_keras_or_lightning_name_is_its_values_over_the_epochs():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g)
    y = (X[:, 0] > 0).long()
    result = dptrain.fit(nn.Linear(4, 2), (X, y), (X, y), epochs=3, eval_every=2, batch_size=16, devices=2,
                         train_metrics=True, log=None, progress=False)
    h = result["history"]
    rows = list(h)
    assert h[0] is rows[0] and h[-1]["epoch"] == 3 and h[1:] == rows[1:] and len(h) == 3
    assert h["train_loss"] == h["loss"] == [row["train_loss"] for row in rows]
    assert h["accuracy"] == [row["train_acc"] for row in rows]
    # Epoch 1 was not evaluated (eval_every=2: epoch 2 and the last are): nan keeps one value per epoch.
    for name in ("test_loss", "val_loss"):
        assert math.isnan(h[name][0]) and h[name][1:] == [rows[1]["test_loss"], rows[2]["test_loss"]]
    assert h["val_accuracy"][1:] == h["val_acc"][1:] == [rows[1]["test_acc"], rows[2]["test_acc"]]
    assert h.figures()[:3] == ["epoch", "sec", "train_loss"] and "test_acc" in h.figures()
    with pytest.raises(KeyError, match=r"no epoch has a figure 'val_f1'; the rows have epoch, sec.*test_acc"):
        h["val_f1"]
    assert json.loads(json.dumps(h)) == rows                # (saved as before: a list of rows)


def test_an_empty_history_says_no_epoch_ran():
    with pytest.raises(KeyError, match="no epoch ran"):
        History()["loss"]
