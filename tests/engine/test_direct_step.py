"""One device of one process takes the direct step (the plain loop's): the same training as
the general step, every loss kind, NaN handling and clipping included."""
import collections
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import dptrain
from dptrain.data.loader import TensorLoader
from dptrain.core.errors import NonFiniteLoss
from dptrain.engine import direct_step
from dptrain.engine.model_engine import ModelEngine


def data(n=96, seed=0, classes=3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    return X, (X[:, :classes] * 2).argmax(1)


def net(out=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, out))


def train(direct, model, train_data, monkeypatch, **kw):
    taken = []
    real = direct_step.direct_step

    def spy(*a, **k):
        taken.append(1)
        return real(*a, **k)
    monkeypatch.setattr(direct_step, "direct_step", spy)
    init = ModelEngine.__init__

    def make(self, *a, **k):
        init(self, *a, **k)
        self.direct = direct
    monkeypatch.setattr(ModelEngine, "__init__", make)
    kw.setdefault("optimizer", torch.optim.SGD)
    result = dptrain.fit(model, train_data, devices="cpu:0", epochs=2, batch_size=16, lr=0.3, log=None,
                         progress=False, **kw)
    monkeypatch.undo()
    return result, bool(taken)


LOSSES = {
    "cross-entropy": (lambda: nn.CrossEntropyLoss(), 3, None),
    "weighted, ignore_index": (lambda: nn.CrossEntropyLoss(weight=torch.tensor([0.2, 1.0, 3.0]), ignore_index=1), 3,
                               None),
    "mse": (lambda: nn.MSELoss(), 1, lambda y: y.float().unsqueeze(1)),
    "sum reduction": (lambda: nn.MSELoss(reduction="sum"), 1, lambda y: y.float().unsqueeze(1)),
    "own function": (lambda: (lambda out, y: ((out.squeeze(1) - y) ** 2).mean()), 1, lambda y: y.float()),
    "own (sum, count)": (lambda: (lambda out, y: (((out.squeeze(1) - y) ** 2).sum(), len(y))), 1,
                         lambda y: y.float()),
}


@pytest.mark.parametrize("kind", list(LOSSES))
def test_the_direct_step_trains_as_the_general_step(kind, monkeypatch):
    make_loss, out, target = LOSSES[kind]
    X, y = data()
    y = target(y) if target else y
    runs = {}
    for direct in (True, False):
        model = net(out)
        result, taken = train(direct, model, (X, y), monkeypatch, loss=make_loss())
        assert taken == direct
        runs[direct] = (result["history"], [p.detach().clone() for p in model.parameters()])
    for a, b in zip(runs[True][1], runs[False][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for ra, rb in zip(runs[True][0], runs[False][0]):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-6)


def test_the_direct_step_equals_the_plain_loop_and_reports_its_mean_loss(monkeypatch):
    X, y = data()
    loss = nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.0, 2.0]))
    model = net()
    result, taken = train(True, model, (X, y), monkeypatch, loss=loss)
    assert taken
    plain = net()
    opt = torch.optim.SGD(plain.parameters(), lr=0.3)
    sums = []
    for epoch in range(2):
        loader = TensorLoader((X, y), 16, shuffle=True, seed=0)
        loader.set_epoch(epoch)
        total = count = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            value = loss(plain(xb), yb)
            value.backward()
            opt.step()
            w = loss.weight[yb].sum()
            total, count = total + value.item() * float(w), count + float(w)
        sums.append(total / count)
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)
    assert [r["train_loss"] for r in result["history"]] == pytest.approx(sums, rel=1e-6)


def test_the_direct_step_stops_on_nan_skips_and_clips_as_the_general_one(monkeypatch):
    X, y = data()
    X[40] = math.nan
    with pytest.raises(NonFiniteLoss, match="NaN or infinite at epoch 1"):
        train(True, net(), (X, y), monkeypatch)
    for direct in (True, False):
        result, _ = train(direct, net(), (X, y), monkeypatch, on_nan="skip")
        assert result["history"][0]["skipped"] == 1
    norms = {}
    for direct in (True, False):
        model = net()
        train(direct, model, data(), monkeypatch, clip_grad_norm=0.05)
        norms[direct] = [p.detach().clone() for p in model.parameters()]
    for a, b in zip(norms[True], norms[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_general_step_is_kept_where_there_is_something_to_sum(monkeypatch):
    X, y = data()
    _, taken = train(True, net(), (X, y), monkeypatch, accumulate_grad_batches=2)
    assert not taken            # micro-batches: their means would need weighting
    taken_two = []
    real = direct_step.direct_step
    monkeypatch.setattr(direct_step, "direct_step", lambda *a, **k: taken_two.append(1) or real(*a, **k))
    dptrain.fit(net(), (X, y), devices="cpu:0,cpu:1", epochs=1, batch_size=16, log=None, progress=False)
    assert not taken_two


def test_a_batch_whose_targets_are_all_ignored_is_skipped_or_stops_alike_on_one_and_two_devices():
    X, y = data(64)
    y[1:] = -100                # three of the four batches have no target that counts
    rows = {}
    for devices in ("cpu:0", "cpu:0,cpu:1"):
        torch.manual_seed(0)
        model = net()
        result = dptrain.fit(model, (X, y), devices=devices, epochs=1, batch_size=16, lr=0.1, log=None,
                             on_nan="skip", optimizer=torch.optim.SGD)
        rows[devices] = result["history"][0]
        assert all(torch.isfinite(p).all() for p in model.parameters())
        with pytest.raises(NonFiniteLoss, match="all ignore_index"):
            dptrain.fit(net(), (X, y), devices=devices, epochs=1, batch_size=16, lr=0.1, log=None,
                        optimizer=torch.optim.SGD)
    assert rows["cpu:0"]["skipped"] == rows["cpu:0,cpu:1"]["skipped"] == 3
    assert rows["cpu:0"]["train_loss"] == pytest.approx(rows["cpu:0,cpu:1"]["train_loss"], rel=1e-6)
    assert math.isfinite(rows["cpu:0"]["train_loss"])


class _Ops(TorchDispatchMode):
    """Counts the ATen operations dispatched while on (each a kernel launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


class _Keywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = net()

    def forward(self, x):
        return self.body(x)


def _forward_ops(model, loss, X, y):
    with _Ops() as ops:
        loss(model, X, y)
    return ops.counts


PROGRAMS = {      # what dptrain is given; the plain loop's loss on the same batch
    "loss module": (lambda: dict(loss=nn.CrossEntropyLoss()), lambda m, X, y: F.cross_entropy(m(X), y)),
    "mse": (lambda: dict(loss=nn.MSELoss()), lambda m, X, y: F.mse_loss(m(X), y.float().unsqueeze(1).expand(-1, 3))),
    "step function, mean": (lambda: dict(step=lambda m, b: {"loss": F.cross_entropy(m(b[0]), b[1]), "logits": None}),
                            lambda m, X, y: F.cross_entropy(m(X), y)),
    "dict batch": (lambda: dict(loss=nn.CrossEntropyLoss()), lambda m, X, y: F.cross_entropy(m(x=X), y)),
}


@pytest.mark.parametrize("kind", list(PROGRAMS))
def test_the_direct_step_dispatches_the_plain_loops_operations(kind):
    """On a GPU every operation a step adds is host time (issue 22): one device of one process
    runs exactly the plain loop's operations, plus detaching the loss it reports."""
    given, plain_loss = PROGRAMS[kind]
    X, y = data(16)
    target = y.float().unsqueeze(1).expand(-1, 3).contiguous() if kind == "mse" else y
    batch = {"x": X, "labels": target} if kind == "dict batch" else (X, target)
    model = _Keywords() if kind == "dict batch" else net()
    engine = ModelEngine(dptrain.Task(model, batch, optimizer=torch.optim.SGD, **given()), [torch.device("cpu")])
    engine.prepare(batch, 0.1)
    engine.train_batch(batch)                   # the first step checks the loss once
    with _Ops() as ours:
        engine.train_batch(batch)
    plain = _Keywords() if kind == "dict batch" else net()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for counting in (False, True):
        with _Ops() if counting else contextlib.nullcontext() as theirs:
            opt.zero_grad()
            plain_loss(plain, X, y).backward()
            opt.step()
    launched = [op for op in ours.counts if not op.startswith("profiler.")]      # (torch.optim's step records itself)
    extra = collections.Counter({op: ours.counts[op] for op in launched}) - theirs.counts
    with _Ops() as detach:                      # what detaching a loss dispatches (torch 2.3: two detaches)
        plain_loss(plain, X, y).detach()
    assert extra == detach.counts - _forward_ops(plain, plain_loss, X, y), extra
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b)
