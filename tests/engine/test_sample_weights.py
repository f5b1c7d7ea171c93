"""Keras's ``sample_weight``: each training sample's loss times its own weight, over the samples;
the same on 1, 2, 3 devices and 2 processes as the plain loop; evaluation unweighted."""
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import dptrain
from tests.distributed.helpers import run_workers

N, BATCH, LR = 90, 16, 0.5


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, 5, generator=g, dtype=torch.float64)
    y = (X[:, 0] > 0.5).long() + (X[:, 1] > 1).long()
    w = torch.rand(N, generator=g, dtype=torch.float64) * 3
    return X, y, w


def net(outputs=3):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, outputs)).double()


def plain_loop(per_sample, X, y, w, outputs=3, epochs=2, n=N):
    """Keras's weighted training: each batch's per-sample losses times their weights, over the samples."""
    model = net(outputs)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(epochs):
        for i in range(0, n, BATCH):
            part = slice(i, min(i + BATCH, n))
            per = per_sample(model(X[part]), y[part])
            opt.zero_grad()
            (per * w[part].view(-1, *[1] * (per.dim() - 1))).mean().backward()
            opt.step()
    return model


def assert_same(model, want, tol=1e-12):
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)


def fit(model, train, eval_data=None, **keywords):
    keywords = {"optimizer": "sgd", "lr": LR, "epochs": 2, "batch_size": BATCH, "shuffle": False, "log": None,
                **keywords}
    return dptrain.fit(model, train, eval_data, **keywords)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_sample_weights_train_as_keras_weighs_them_and_evaluate_unweighted(devices):
    X, y, w = data()
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w)
    model = net()
    result = fit(model, (X, y), (X, y), sample_weight=w.tolist(), devices=devices)       # (a list, as Keras takes)
    assert_same(model, want, 0 if devices == 1 else 1e-12)
    assert result["history"][-1]["test_loss"] == pytest.approx(F.cross_entropy(want(X), y).item(), rel=1e-12)
    assert result["history"][-1]["test_acc"] == pytest.approx((want(X).argmax(1) == y).double().mean().item())
    unweighted = net()
    fit(unweighted, (X, y), devices=devices)
    assert (unweighted[0].weight - model[0].weight).abs().max() > 1e-3        # (the weights did weigh)


@pytest.mark.parametrize("devices", [1, 2])
def test_an_element_wise_loss_weighs_each_samples_mean_over_its_elements(devices):
    X, _, w = data()
    y = torch.stack([X[:, 0] * 2, X[:, 1] - X[:, 2]], 1)
    want = plain_loop(lambda o, t: F.mse_loss(o, t, reduction="none"), X, y, w, outputs=2)
    model = net(2)
    fit(model, (X, y), loss="mse", sample_weight=w, devices=devices)
    assert_same(model, want, 0 if devices == 1 else 1e-12)


def test_class_and_sample_weights_multiply_as_in_keras():
    X, y, w = data()
    yb = (y > 0).double().unsqueeze(1)
    cw = torch.tensor([0.5, 3.0], dtype=torch.float64)
    want = plain_loop(lambda o, t: F.binary_cross_entropy_with_logits(o, t, reduction="none") * cw[t.long()],
                      X, yb, w, outputs=1)
    model = net(1)
    fit(model, (X, yb), loss="bce", class_weight={0: 0.5, 1: 3.0}, sample_weight=w, devices=2)
    assert_same(model, want)


class Tokens(Dataset):
    """Samples a collate function makes into dict batches (a text classifier's, padded)."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.X[i], self.y[i]


def as_dict(samples):
    return {"x": torch.stack([x for x, _ in samples]), "labels": torch.stack([t for _, t in samples])}


class ByName(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = net()

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_dataset_and_its_collate_fn_get_the_weights_beside_their_batches(devices):
    X, y, w = data()
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w)
    model = ByName()
    fit(model, Tokens(X, y), sample_weight=w.numpy(), collate_fn=as_dict, devices=devices)
    assert_same(model.net, want, 0 if devices == 1 else 1e-12)


class Weighted(Dataset):
    def __init__(self, X, y, w):
        self.X, self.y, self.w = X, y, w

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.X[i], self.y[i], self.w[i]


@pytest.mark.parametrize("devices", [1, 2])
def test_batches_carrying_their_weights_last_train_with_sample_weight_true(devices):
    X, y, w = data()
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w)
    model = net()
    result = fit(model, Weighted(X, y, w), (X, y), sample_weight=True, devices=devices)
    assert_same(model, want, 0 if devices == 1 else 1e-12)
    assert result["history"][-1]["test_loss"] == pytest.approx(F.cross_entropy(want(X), y).item(), rel=1e-12)
    with pytest.raises(ValueError, match=r"sample_weight=True reads each training batch's weights as its last item, "
                                         r"\(x, y, w\), and this batch is a tuple of 2 items"):
        fit(net(), (X, y), sample_weight=True, devices=devices, epochs=1)


def test_dict_columns_get_the_weights_under_their_key_and_dict_batches_carrying_them_train_alike():
    X, y, w = data()
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w)
    for columns, weights in (({"x": X, "labels": y}, w), ({"x": X, "labels": y, "sample_weight": w}, True)):
        model = ByName()
        fit(model, columns, sample_weight=weights, devices=2)
        assert_same(model.net, want)


@pytest.mark.parametrize("as_dataset", [False, True])
def test_validation_split_keeps_each_parts_weights_as_keras(as_dataset):
    """The training part trains on its rows' weights; the held-out part's test_loss is
    weighed by its own (Keras splits sample_weight with x and y), its accuracy is not."""
    X, y, w = data()
    keep = int(N * 0.8)
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w, n=keep)
    model = ByName() if as_dataset else net()
    train = Tokens(X, y) if as_dataset else (X, y)
    result = fit(model, train, sample_weight=w, validation_split=0.2, devices=2,
                 **({"collate_fn": as_dict} if as_dataset else {}))
    assert_same(model.net if as_dataset else model, want)
    with torch.no_grad():
        out = want(X[keep:])
    row = result["history"][-1]
    assert row["test_loss"] == pytest.approx((F.cross_entropy(out, y[keep:], reduction="none") * w[keep:]).mean()
                                             .item(), rel=1e-12)
    assert row["test_acc"] == pytest.approx((out.argmax(1) == y[keep:]).double().mean().item())


def test_accumulated_micro_batches_weigh_as_their_whole_batch():
    X, y, w = data()
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w, epochs=1)
    for devices in (1, 2):
        model = net()
        fit(model, (X, y), sample_weight=w, batch_size=BATCH // 2, accumulate_grad_batches=2, epochs=1,
            devices=devices)
        assert_same(model, want)


def test_an_optimizer_evaluating_a_closure_weighs_each_evaluation():
    X, y, w = data()
    want = net()
    opt = torch.optim.LBFGS(want.parameters(), lr=LR, max_iter=4)
    for i in range(0, N, BATCH):
        part = slice(i, i + BATCH)

        def closure():
            opt.zero_grad()
            loss = (F.cross_entropy(want(X[part]), y[part], reduction="none") * w[part]).mean()
            loss.backward()
            return loss
        opt.step(closure)
    for devices in (1, 2):
        model = net()
        fit(model, (X, y), sample_weight=w, optimizer=functools.partial(torch.optim.LBFGS, max_iter=4), epochs=1,
            devices=devices)
        assert_same(model, want, 0 if devices == 1 else 1e-12)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_evaluate_weighs_its_loss_as_kerass_evaluate_and_leaves_the_accuracy_unweighted(devices):
    X, y, w = data()
    model = net()
    figures = dptrain.evaluate(model, (X, y), sample_weight=w, batch_size=BATCH, devices=devices)
    with torch.no_grad():
        out = model(X)
    assert figures["test_loss"] == pytest.approx((F.cross_entropy(out, y, reduction="none") * w).mean().item(),
                                                 rel=1e-12)
    assert figures["test_acc"] == pytest.approx((out.argmax(1) == y).double().mean().item())
    two = torch.stack([X[:, 0], X[:, 1]], 1)
    head = net(2)
    with torch.no_grad():
        mse = ((head(X) - two) ** 2).mean(1)
    assert dptrain.evaluate(head, (X, two), loss="mse", sample_weight=w, devices=devices)["test_loss"] == \
        pytest.approx((mse * w).mean().item(), rel=1e-12)
    with pytest.raises(ValueError, match=r"sample_weight weighs one set's samples, and the data holds 2 sets"):
        dptrain.evaluate(model, {"val": (X, y), "ood": (X, y)}, sample_weight=w, devices=devices)


@pytest.mark.parametrize("devices", [1, 2])
def test_an_evaluation_set_carrying_weights_last_weighs_fits_test_loss_as_kerass_validation_data(devices):
    """Keras's validation_data=(x_val, y_val, val_sample_weight): each evaluation's test_loss
    weighed as dptrain.evaluate's, its accuracy not; trained unweighted or weighted alike."""
    X, y, w = data()
    Xv, yv, wv = data(seed=3)
    lines = []
    for train_weights in (None, w):
        model = net()
        result = fit(model, (X, y), (Xv, yv, wv), epochs=1, devices=devices, sample_weight=train_weights,
                     log=lines.append)
        with torch.no_grad():
            out = model(Xv)
        row = result["history"][-1]
        assert row["test_loss"] == pytest.approx((F.cross_entropy(out, yv, reduction="none") * wv).mean().item(),
                                                 rel=1e-12)
        assert row["test_acc"] == pytest.approx((out.argmax(1) == yv).double().mean().item())
        assert row["test_loss"] == pytest.approx(dptrain.evaluate(model, (Xv, yv), sample_weight=wv,
                                                                  devices=devices)["test_loss"], rel=1e-12)
    assert sum("(x, y, w): w weighs the samples" in line for line in lines) == 2
    # several sets: each weighed by its own, or not at all
    model = net()
    row = fit(model, (X, y), {"val": (Xv, yv, wv), "ood": (X, y)}, epochs=1, devices=devices)["history"][-1]
    with torch.no_grad():
        per_val, per_ood = F.cross_entropy(model(Xv), yv, reduction="none"), F.cross_entropy(model(X), y)
    assert row["test_loss"] == pytest.approx((per_val * wv).mean().item(), rel=1e-12)
    assert row["test_ood_loss"] == pytest.approx(per_ood.item(), rel=1e-12)


def test_a_model_of_two_inputs_evaluates_its_three_columns_unweighted():
    X, y, _ = data()
    Xv, yv, _ = data(seed=3)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = net()

        def forward(self, a, b):
            return self.inner(a + b)
    model = Two()
    row = fit(model, (X, X, y), (Xv, Xv, yv), epochs=1, devices=1)["history"][-1]
    with torch.no_grad():
        assert row["test_loss"] == pytest.approx(F.cross_entropy(model(Xv, Xv), yv).item(), rel=1e-12)


@pytest.mark.parametrize("eval_data, keywords, match", [
    (lambda v: (v[0], v[1], -torch.ones(N)), {}, r"sample_weight\[0\] is -1.0: every weight must be a finite number"),
    (lambda v: v, {"loss": lambda out, y: F.cross_entropy(out, y)}, r"sample_weight weighs a torch loss's per-sample"),
    (lambda v: v, {"step": lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])},
     r"the evaluation set 'test' carries sample weights \(its third item\), which weigh fit's loss, and a step"),
])
def test_evaluation_weights_fit_cannot_take_are_errors_naming_the_fix(eval_data, keywords, match):
    X, y, _ = data()
    with pytest.raises(ValueError, match=match):
        fit(net(), (X, y), eval_data(data(seed=3)), epochs=1, devices=1, **keywords)


class Stream(IterableDataset):
    def __iter__(self):
        return iter([])


@pytest.mark.parametrize("keywords, match", [
    ({"sample_weight": torch.ones(N - 1)}, r"sample_weight has 89 weights, and the training data 90 samples"),
    ({"sample_weight": -torch.ones(N)}, r"sample_weight\[0\] is -1.0: every weight must be a finite number >= 0"),
    ({"sample_weight": torch.ones(N, 2)}, r"one weight a sample, shape \(90,\); got \(90, 2\)"),
    ({"sample_weight": {0: 1.0}}, r"one weight a training sample .*weights by class: class_weight="),
    ({"sample_weight": 2.0}, r"sample_weight is one weight a training sample"),
    ({"sample_weight": torch.ones(N), "loss": lambda out, y: F.cross_entropy(out, y)},
     r"sample_weight weighs a torch loss's per-sample values .* not <lambda>'s: for a loss of your own, read the "
     r"weights from the batch"),
    ({"sample_weight": torch.ones(N), "loss": nn.CrossEntropyLoss(weight=torch.ones(3, dtype=torch.float64))},
     r"sample_weight and the loss's own weight= both weigh"),
    ({"sample_weight": torch.ones(N), "step": lambda model, batch: model(batch[0]).sum()},
     r"sample_weight weighs fit's loss, and a step function"),
])
def test_sample_weights_fit_cannot_take_are_errors_naming_the_fix(keywords, match):
    X, y, _ = data()
    with pytest.raises((ValueError, TypeError), match=match):
        fit(net(), (X, y), epochs=1, devices=1, **keywords)


def test_data_without_indices_to_weigh_by_is_an_error_naming_sample_weight_true():
    X, y, w = data()
    with pytest.raises(ValueError, match=r"sample_weight with a DataLoader: give its Dataset .* with "
                                         r"sample_weight=True"):
        fit(net(), DataLoader(TensorDataset(X, y), batch_size=BATCH), sample_weight=w, devices=1, epochs=1)
    with pytest.raises(ValueError, match="sample_weight beside an IterableDataset.*give sample_weight=True"):
        fit(net(), Stream(), sample_weight=w, devices=1, epochs=1)
    with pytest.raises(ValueError, match="the data holds a 'sample_weight' key already"):
        fit(net(), {"x": X, "y": y, "sample_weight": w}, sample_weight=w, devices=1, epochs=1)


def test_a_model_computing_its_own_loss_is_an_error_naming_loss():
    class OwnLoss(nn.Module):       # (a question-answering model's: no target key in the batch)
        def __init__(self):
            super().__init__()
            self.net = net()

        def forward(self, x, start_positions=None):
            logits = self.net(x)
            loss = None if start_positions is None else F.cross_entropy(logits, start_positions)
            return {"loss": loss, "logits": logits}

    X, y, w = data()
    with pytest.raises(ValueError, match="sample_weight weighs fit's loss, and the model computes its own"):
        fit(OwnLoss(), {"x": X, "start_positions": y}, sample_weight=w, devices=1, epochs=1)


def two_processes(rank, world):
    X, y, w = data()
    model, by_name = net(), ByName()
    result = fit(model, (X, y), {"plain": (X, y), "weighed": (X, y, w)}, sample_weight=w, devices=1)
    fit(by_name, Tokens(X, y), sample_weight=w.numpy(), collate_fn=as_dict, devices=2)     # (a Dataset's pairs)
    return ([p.detach().tolist() for p in model.parameters()], result["history"][-1]["test_loss"],
            result["history"][-1]["test_weighed_loss"],
            [p.detach().tolist() for p in by_name.net.parameters()],
            dptrain.evaluate(model, (X, y), sample_weight=w, batch_size=BATCH, devices=2)["test_loss"])


def test_sample_weights_on_two_processes_train_as_the_plain_loop():
    X, y, w = data()
    want = plain_loop(lambda o, t: F.cross_entropy(o, t, reduction="none"), X, y, w)
    with torch.no_grad():
        weighted = (F.cross_entropy(want(X), y, reduction="none") * w).mean().item()
    for params, test_loss, weighed_loss, of_dataset, evaluated in run_workers(two_processes):
        assert evaluated == pytest.approx(weighted, rel=1e-12) and weighed_loss == pytest.approx(weighted, rel=1e-12)
        for p, d, q in zip(params, of_dataset, want.parameters()):
            torch.testing.assert_close(torch.tensor(p, dtype=torch.float64), q, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(torch.tensor(d, dtype=torch.float64), q, rtol=1e-12, atol=1e-12)
        assert test_loss == pytest.approx(F.cross_entropy(want(X), y).item(), rel=1e-12)
