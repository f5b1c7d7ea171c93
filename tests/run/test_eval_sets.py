"""``fit(eval_data={"val": ..., "ood": ...})``: several evaluation sets, the first giving the
``test_*`` figures and each other ``test_<name>_*``, evaluated at every evaluation (epochs,
steps, on EMA's average), each the figures ``dptrain.evaluate`` gives on its own."""
import functools

import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks import EMA, EarlyStopping

G = torch.Generator().manual_seed(4)
X = torch.randn(200, 8, generator=G)
Y = (X[:, 0] + X[:, 1] > 0).long()
XO = 3 * torch.randn(70, 8, generator=G)
YO = (XO[:, 0] > 0).long()


def mae(output, target):
    return (output.argmax(1) - target).abs().sum(), target.numel()


def train(devices=1, callbacks=(), **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    kw.setdefault("log", None)
    result = dptrain.fit(model, (X, Y), {"val": (X[:50], Y[:50]), "ood": (XO, YO)}, epochs=3, batch_size=20,
                         devices=devices, optimizer=functools.partial(torch.optim.Adam, lr=0.01),
                         metrics={"mae": mae}, callbacks=list(callbacks), **kw)
    return model, result


def test_each_set_gives_what_evaluate_gives_on_it_on_any_number_of_devices():
    model, result = train()
    last = result["history"][-1]
    assert {k for k in last if k.startswith("test")} == {"test_loss", "test_acc", "test_mae", "test_ood_loss",
                                                         "test_ood_acc", "test_ood_mae"}
    alone = dptrain.evaluate(model, (XO, YO), metrics={"mae": mae}, devices=1)
    assert {k: last[f"test_ood_{k[5:]}"] for k in alone} == pytest.approx(alone)
    assert dptrain.evaluate(model, (X[:50], Y[:50]), metrics={"mae": mae}, devices=1) == \
        pytest.approx({k: last[k] for k in ("test_loss", "test_acc", "test_mae")})
    assert result["test_ood_acc"] == last["test_ood_acc"]
    both = dptrain.evaluate(model, {"val": (X[:50], Y[:50]), "ood": (XO, YO)}, metrics={"mae": mae}, devices=2)
    assert both == pytest.approx({k: v for k, v in last.items() if k.startswith("test")})
    _, two = train(devices=2)
    assert two["history"][-1] == pytest.approx({**last, "sec": two["history"][-1]["sec"]}, rel=1e-5)


def test_step_evaluations_ema_and_monitors_take_the_other_sets_too():
    _, result = train(eval_every_n_steps=5)             # 10 updates an epoch
    rows = {r["step"]: r for r in result["step_history"]}
    assert "test_ood_acc" in rows[5] and rows[10]["test_ood_loss"] == result["history"][0]["test_ood_loss"]
    ema = EMA(0.5, evaluate=True)
    averaged, result = train(callbacks=[ema])
    ema.copy_to(averaged)
    assert dptrain.evaluate(averaged, (XO, YO), devices=1)["test_loss"] == \
        pytest.approx(result["history"][-1]["test_ood_loss"])
    _, stopped = train(callbacks=[EarlyStopping("test_ood_acc", patience=1, min_delta=1.0)])
    assert len(stopped["history"]) == 2                  # nothing improves by 1.0: stopped after 1 + patience


def test_names_that_cannot_name_figures_are_refused():
    with pytest.raises(ValueError, match="evaluation set names must be identifiers"):
        dptrain.fit(nn.Linear(8, 2), (X, Y), {"val": (X, Y), "out of domain": (XO, YO)}, epochs=1, log=None)
    with pytest.raises(ValueError, match=r"the evaluation set 'ood' would make figures the first set has "
                                         r"\(test_ood_mae\)"):
        dptrain.fit(nn.Linear(8, 2), (X, Y), {"val": (X, Y), "ood": (XO, YO)}, metrics={"mae": mae, "ood_mae": mae},
                    epochs=1, log=None)
    one = dptrain.fit(nn.Linear(8, 2), {"x": X, "y": Y}, {"x": X[:40], "y": Y[:40]}, epochs=1, log=None,
                      forward=lambda m, b: (m(b["x"]), b["y"]))
    assert "test_loss" in one and not any(k.startswith("test_x") for k in one)   # a dict of tensors: one set
