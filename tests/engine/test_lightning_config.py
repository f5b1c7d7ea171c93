"""Lightning's ``configure_optimizers`` output as fit's optimizer: the same run as the same
optimizer, scheduler, interval and monitor given as fit's keywords; its forms' errors."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.lightning_config import unpack

Plateau, StepLR = torch.optim.lr_scheduler.ReduceLROnPlateau, torch.optim.lr_scheduler.StepLR


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    return X, (X[:, :2].sum(1) > 0).long()


def run(devices, **kw):
    """Three epochs of a classifier; ``kw`` says the optimizer and schedule, each a function
    of the model's optimizer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    kw = {k: v(opt) if callable(v) and k != "scheduler" else v for k, v in kw.items()}
    if callable(kw.get("scheduler")):
        kw["scheduler"] = kw["scheduler"](opt)
    result = dptrain.fit(model, data(96, 1), data(40, 2), epochs=5, batch_size=16, devices=devices, log=None,
                         progress=False, **{"optimizer": opt, **kw})
    return [{k: v for k, v in row.items() if k != "sec"} for row in result["history"]]


@pytest.mark.parametrize("devices", [1, 2])
def test_each_form_runs_as_the_same_keywords(devices):
    def plateau(opt):
        return Plateau(opt, mode="max", patience=0, factor=0.5)
    ours = run(devices, scheduler=plateau, scheduler_monitor="test_acc")
    forms = [
        dict(optimizer=lambda opt: {"optimizer": opt, "lr_scheduler": {"scheduler": plateau(opt),
                                                                        "monitor": "val_acc", "interval": "epoch"}}),
        dict(optimizer=lambda opt: {"optimizer": opt, "lr_scheduler": plateau(opt), "monitor": "val_accuracy"}),
        dict(scheduler=lambda opt: {"scheduler": plateau(opt), "monitor": "test_acc", "frequency": 1,
                                    "strict": True, "name": "lr"}),
    ]
    for form in forms:
        assert run(devices, **form) == ours, form
    assert len({row["lr"] for row in ours}) > 1                 # (the plateau decided something)
    ours = run(devices, scheduler=lambda opt: StepLR(opt, 3, 0.5), scheduler_interval="batch")
    for form in (dict(optimizer=lambda opt: ([opt], [{"scheduler": StepLR(opt, 3, 0.5), "interval": "step"}])),
                 dict(optimizer=lambda opt: {"optimizer": opt, "monitor": "val_loss",     # (no plateau: not read)
                                             "lr_scheduler": {"scheduler": StepLR(opt, 3, 0.5), "interval": "step"}})):
        assert run(devices, **form) == ours, form
    assert run(devices, optimizer=lambda opt: ([opt], [])) == run(devices)


def test_what_does_not_fit_is_an_error_naming_both_sides():
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    config = {"scheduler": StepLR(opt, 1), "interval": "step", "frequency": 2}
    with pytest.raises(ValueError, match="frequency=2: a scheduler steps every epoch or every batch here"):
        unpack(opt, config, "epoch", None)
    config["frequency"] = 1
    with pytest.raises(ValueError, match="scheduler_interval='batch' and Lightning's config's 'epoch': give one"):
        unpack(opt, dict(config, interval="epoch"), "batch", None)
    assert unpack(opt, config, "step", None)[2] == "batch" and unpack(opt, config, None, None)[2] == "batch"
    with pytest.raises(ValueError, match="scheduler_interval='epoch' and Lightning's config's 'batch': give one"):
        unpack(opt, config, "epoch", None)          # (said, not the default: the two disagree)
    assert dptrain.Task(nn.Linear(2, 2), torch.zeros(4, 2)).scheduler_interval == "epoch"    # (the default)
    with pytest.raises(ValueError, match="scheduler_monitor='test_f1' and Lightning's config's 'val_loss'"):
        unpack(opt, {"scheduler": Plateau(opt), "monitor": "val_loss"}, "epoch", "test_f1")
    with pytest.raises(ValueError, match="configure_optimizers\\(\\) output, which holds the scheduler: drop "
                                         "scheduler="):
        unpack({"optimizer": opt}, StepLR(opt, 1), "epoch", None)
    other = torch.optim.Adam(nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match="configure_optimizers\\(\\) gave 2 optimizers and 0 schedulers: with one "
                                         "loss give optimizer=\\{name: optimizer\\}"):
        unpack(([opt, other], []), None, "epoch", None)
    assert unpack({"a": opt, "b": other}, None, "epoch", None)[0] == {"a": opt, "b": other}   # (our own dict)
