"""Keras's ``class_weight``: each training sample's loss times its class's weight, over the
samples; the same on 1, 2, 3 devices and 2 processes as the plain loop; evaluation unweighted."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.distributed.helpers import run_workers

N, BATCH, LR = 90, 16, 0.5
WEIGHTS = {0: 0.3, 1: 4.0, 2: 9.5}


def data(binary=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, 5, generator=g, dtype=torch.float64)
    y = (X[:, 0] > 0.5).long() + (0 if binary else (X[:, 1] > 1).long())
    return X, (y.double().unsqueeze(1) if binary else y)


def net(outputs=3):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, outputs)).double()


def keras_loss(per_sample, weights):
    """The plain loop's loss as Keras computes it: the weighted per-sample losses over the samples."""
    def loss(output, target):
        classes = target.round().long().view(-1) if target.is_floating_point() else target
        w = torch.tensor([weights.get(c, 1.0) for c in range(output.shape[1] if output.shape[1] > 1 else 2)],
                         dtype=torch.float64)[classes].view(target.shape if target.is_floating_point() else -1)
        return (per_sample(output, target) * w).mean()
    return loss


def plain_loop(loss, X, y, outputs=3, epochs=2):
    model = net(outputs)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(epochs):
        for i in range(0, N, BATCH):
            opt.zero_grad()
            loss(model(X[i:i + BATCH]), y[i:i + BATCH]).backward()
            opt.step()
    return model


def fitted(devices, class_weight=WEIGHTS, binary=False, **keywords):
    X, y = data(binary)
    model = net(1 if binary else 3)
    result = dptrain.fit(model, (X, y), (X, y), class_weight=class_weight, optimizer="sgd", lr=LR, epochs=2,
                         batch_size=BATCH, devices=devices, shuffle=False, log=None, **keywords)
    return model, result


def assert_same(model, want, tol=1e-12):
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_class_weights_train_as_keras_weighs_them_and_evaluate_unweighted(devices):
    X, y = data()
    want = plain_loop(keras_loss(lambda o, t: F.cross_entropy(o, t, reduction="none"), WEIGHTS), X, y)
    model, result = fitted(devices)
    assert_same(model, want)
    # the test loss is the plain one, as Keras's val_loss; the accuracy is counted as ever
    assert result["history"][-1]["test_loss"] == pytest.approx(F.cross_entropy(want(X), y).item(), rel=1e-12)
    assert result["test_acc"] == pytest.approx((want(X).argmax(1) == y).double().mean().item())
    # not the weighted mean of CrossEntropyLoss(weight=...): that trains otherwise
    other = plain_loop(nn.CrossEntropyLoss(weight=torch.tensor([0.3, 4.0, 9.5], dtype=torch.float64)), X, y)
    assert max((p - q).abs().max().item() for p, q in zip(model.parameters(), other.parameters())) > 1e-3


@pytest.mark.parametrize("devices", [1, 2])
def test_binary_class_weights_weigh_bce_by_the_target_class(devices):
    X, y = data(binary=True)
    weights = {0: 0.5, 1: 3.0}
    want = plain_loop(keras_loss(lambda o, t: F.binary_cross_entropy_with_logits(o, t, reduction="none"), weights),
                      X, y, outputs=1)
    model, result = fitted(devices, weights, binary=True, loss="bce")
    assert_same(model, want)
    assert result["history"][-1]["test_loss"] == pytest.approx(
        F.binary_cross_entropy_with_logits(want(X), y).item(), rel=1e-12)


def test_a_list_of_weights_and_a_sum_reduction_and_nll_train_as_the_plain_loop():
    X, y = data()
    weights = [2.0, 0.5]                        # class 2 unnamed: weighs 1, as in Keras
    want = plain_loop(lambda o, t: (F.nll_loss(o.log_softmax(1), t, reduction="none")
                                    * torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64)[t]).sum() / 8, X, y)
    model = net()
    dptrain.fit(model, (X, y), class_weight=weights, forward=lambda m, b: (m(b[0]).log_softmax(1), b[1]),
                loss=nn.NLLLoss(reduction="sum"), optimizer="sgd", lr=LR / 8, epochs=2, batch_size=BATCH,
                devices=2, shuffle=False, log=None)
    assert_same(model, want)


@pytest.mark.parametrize("devices", [1, 2])
def test_ignored_targets_are_not_counted_and_probability_targets_weigh_by_their_likeliest_class(devices):
    X, y = data()
    y_ignored = y.clone()
    y_ignored[::7] = -100
    want = plain_loop(lambda o, t: (F.cross_entropy(o, t, reduction="none")
                                    * torch.tensor([0.3, 4.0, 9.5], dtype=torch.float64)[t.clamp(min=0)]).sum()
                      / (t != -100).sum(), X, y_ignored)
    model = net()
    dptrain.fit(model, (X, y_ignored), class_weight=WEIGHTS, optimizer="sgd", lr=LR, epochs=2, batch_size=BATCH,
                devices=devices, shuffle=False, log=None)
    assert_same(model, want)
    soft = F.one_hot(y, 3).double() * 0.8 + 0.2 / 3
    want = plain_loop(lambda o, t: (F.cross_entropy(o, t, reduction="none") * torch.tensor(
        [0.3, 4.0, 9.5], dtype=torch.float64)[t.argmax(1)]).mean(), X, soft)
    model = net()
    dptrain.fit(model, (X, soft), class_weight=WEIGHTS, optimizer="sgd", lr=LR, epochs=2, batch_size=BATCH,
                devices=devices + 1, shuffle=False, log=None)
    assert_same(model, want)


@pytest.mark.parametrize("keywords, match", [
    ({"class_weight": {0: 1.0, 5: 2.0}}, r"class_weight names class 5, and the model gives 3 classes \(0 to 2\)"),
    ({"class_weight": {0: -1.0}}, r"class_weight\[0\] must be a finite number >= 0, got -1.0"),
    ({"class_weight": {"cat": 1.0}}, r"class_weight's keys are class indices"),
    ({"class_weight": {0: 1.0}, "loss": "mse"}, r"class_weight weighs a classification loss .* not MSELoss"),
    ({"class_weight": {0: 1.0}, "loss": nn.CrossEntropyLoss(weight=torch.ones(3))},
     r"class_weight and the loss's own weight= both weigh the classes"),
    ({"class_weight": {0: 1.0}, "step": lambda m, b: F.cross_entropy(m(b[0]), b[1])},
     r"class_weight weighs fit's loss, and a step function"),
    ({"class_weight": "balanced"}, r"class_weight must be a dict \{class: weight\}"),
])
def test_class_weights_fit_cannot_take_are_errors_naming_the_fix(keywords, match):
    X, y = data()
    with pytest.raises((ValueError, TypeError), match=match):
        dptrain.fit(net(), (X, y), epochs=1, batch_size=BATCH, devices=1, log=None, **keywords)


def test_multi_label_binary_targets_are_an_error():
    X, _ = data()
    y = (X[:, :2] > 0).double()
    with pytest.raises(ValueError, match=r"targets of shape \(16, 2\) hold several a sample \(multi-label\)"):
        dptrain.fit(net(2), (X, y), class_weight={1: 2.0}, loss="bce", epochs=1, batch_size=BATCH, devices=1,
                    log=None)


def two_processes(rank, world):
    model, result = fitted(1)
    return [p.detach().tolist() for p in model.parameters()], result["history"][-1]["test_loss"]


def test_class_weights_on_two_processes_train_as_the_plain_loop():
    X, y = data()
    want = plain_loop(keras_loss(lambda o, t: F.cross_entropy(o, t, reduction="none"), WEIGHTS), X, y)
    for params, test_loss in run_workers(two_processes):
        for p, q in zip(params, want.parameters()):
            torch.testing.assert_close(torch.tensor(p, dtype=torch.float64), q, rtol=1e-12, atol=1e-12)
        assert test_loss == pytest.approx(F.cross_entropy(want(X), y).item(), rel=1e-12)
