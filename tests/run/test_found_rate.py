"""Lightning's LearningRateFinder callback given to fit: the range test first, then the training at its
suggestion (run/found_rate.py)."""
import functools
import re

import pytest
import torch
from torch import nn

import dptrain
from tests.callbacks.test_peer_callbacks import peer
from tests.run.test_lr_find import data


def finder(**settings):
    """Lightning 2.6's LearningRateFinder as it keeps its settings."""
    kept = {"_min_lr": 1e-5, "_max_lr": 1.0, "_num_training_steps": 40, "_mode": "exponential",
            "_early_stop_threshold": 4.0, "_update_attr": True, "_attr_name": ""}
    kept.update({f"_{k}": v for k, v in settings.items()})
    return peer("lightning.pytorch.callbacks.lr_finder", "LearningRateFinder", optimal_lr=None, **kept)


class WithRate(nn.Sequential):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.double()
        self.lr = 0.01          # (a LightningModule's hparam; update_attr sets it)


KEYWORDS = dict(loss=nn.MSELoss(), optimizer=functools.partial(torch.optim.SGD, momentum=0.9), batch_size=32,
                epochs=2, progress=False, shuffle=False)


@pytest.mark.parametrize("devices", [1, 2])
def test_the_range_test_runs_first_and_fit_trains_at_its_suggestion(devices):
    reference = WithRate()
    lr = dptrain.lr_find(reference, data(), min_lr=1e-5, max_lr=1.0, num_training=40, devices=devices,
                         **{k: v for k, v in KEYWORDS.items() if k != "epochs"}).suggestion()
    assert lr is not None and 1e-5 < lr < 1.0
    dptrain.fit(reference, data(), lr=lr, devices=devices, log=None, **KEYWORDS)
    model, cb, lines = WithRate(), finder(), []
    dptrain.fit(model, data(), callbacks=[cb], devices=devices, log=lines.append, **KEYWORDS)
    assert cb.optimal_lr.suggestion() == lr and model.lr == lr          # (update_attr: the model's lr too)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert any(f"lightning's LearningRateFinder ran the range test (dptrain.lr_find, min_lr=1e-05, max_lr=1.0, "
               f"num_training=40, mode='exponential', early_stop_threshold=4.0) before training: lr {lr:.3g}" in line
               for line in lines)


def test_without_update_attr_the_models_lr_stays_and_a_given_lr_is_replaced():
    model, lines = WithRate(), []
    dptrain.fit(model, data(), callbacks=[finder(update_attr=False)], lr=0.3, devices=1, log=lines.append,
                **KEYWORDS)
    assert model.lr == 0.01
    assert any("(in place of the lr=0.3 given)" in line for line in lines)


def test_a_subclass_of_ones_own_and_two_finders_are_errors_naming_the_fix():
    mine = type("FineTuneLearningRateFinder", (type(finder()),), {"__module__": "mine"})()
    mine.__dict__.update(vars(finder()))
    with pytest.raises(TypeError, match=re.escape("here give fit lr=dptrain.lr_find(model, data, min_lr=1e-05")):
        dptrain.fit(WithRate(), data(), callbacks=[mine], devices=1, log=None, **KEYWORDS)
    with pytest.raises(ValueError, match="callbacks holds 2 LearningRateFinder callbacks: give one"):
        dptrain.fit(WithRate(), data(), callbacks=[finder(), finder()], devices=1, log=None, **KEYWORDS)


def test_the_test_writes_none_of_the_runs_files(tmp_path):
    metrics = tmp_path / "run.jsonl"
    result = dptrain.fit(WithRate(), data(), callbacks=[finder()], devices=1, log=None, metrics_file=str(metrics),
                         **KEYWORDS)
    rows = metrics.read_text().splitlines()
    assert len(result["history"]) == 2 and sum('"epoch"' in row for row in rows) == 2    # (the training's alone)
