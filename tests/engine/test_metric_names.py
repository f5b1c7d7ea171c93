"""Keras's metrics by name (``metrics=["accuracy", "mae"]``): each the whole set's figure on
1 and 2 devices, or an error saying what to write."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.metric_names import mean_absolute_error, metrics_named

g = torch.Generator().manual_seed(0)
X = torch.randn(37, 4, generator=g)                 # (37: the last batch of 8 is uneven on 2 devices)
BINARY = (X[:, :1] + 0.3 * torch.randn(37, 1, generator=g) > 0).float()
VALUES = X[:, :1] * 2 + 1


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("loss, last, threshold", [
    ("bce", None, 0.0), (nn.BCELoss(), nn.Sigmoid(), 0.5), (F.binary_cross_entropy_with_logits, None, 0.0)])
def test_accuracy_with_a_binary_cross_entropy_is_the_share_of_outputs_on_the_right_side(devices, loss, last,
                                                                                        threshold):
    """Keras's binary classifier as written (it was an error): test_acc and train_acc counted
    over every element of the whole set, logits at 0, probabilities at 0.5."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1), *([last] if last is not None else []))
    result = dptrain.fit(model, (X, BINARY), (X, BINARY), loss=loss, metrics=["accuracy"], train_metrics=True,
                         optimizer=torch.optim.SGD, lr=0.5, epochs=2, batch_size=8, devices=devices, log=None)
    with torch.no_grad():
        expected = int(((model(X) > threshold) == (BINARY > 0.5)).sum()) / len(X)
    assert result["test_acc"] == pytest.approx(expected, abs=1e-12)
    assert 0.5 < result["test_acc"] and 0 < result["history"][-1]["train_acc"] <= 1


@pytest.mark.parametrize("devices", [1, 2])
def test_mae_and_mse_are_the_means_over_the_whole_set(devices):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    result = dptrain.fit(model, (X, VALUES), (X, VALUES), loss="mse", metrics=["mae", "mean_squared_error"],
                         epochs=1, batch_size=8, devices=devices, log=None)
    with torch.no_grad():
        error = model(X) - VALUES
    assert result["test_mae"] == pytest.approx(error.abs().mean().item(), rel=1e-6)
    assert result["test_mse"] == pytest.approx((error ** 2).mean().item(), rel=1e-6)
    assert result["test_mse"] == pytest.approx(result["test_loss"], rel=1e-6)
    figures = dptrain.evaluate(model, (X, VALUES), loss="mse", metrics=["mae"], batch_size=8, devices=devices)
    assert figures["test_mae"] == pytest.approx(result["test_mae"], rel=1e-6)


def test_an_error_metric_reshapes_one_output_per_sample_instead_of_broadcasting():
    output, target = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1.0, 1.0, 1.0])
    total, count = mean_absolute_error(output, target)
    assert float(total) == 4.0 and count == 3         # broadcast (3, 3) pairs would give 9.0 over 3
    with pytest.raises(ValueError, match=r"outputs of shape \(3, 2\) for targets of shape \(3,\)"):
        mean_absolute_error(torch.zeros(3, 2), target)


def test_accuracy_with_a_classification_loss_adds_nothing_and_the_others_name_the_fix():
    assert metrics_named(["accuracy", "sparse_categorical_accuracy"], None, None) == {}
    assert metrics_named(["acc"], nn.CrossEntropyLoss(), None) == {}
    with pytest.raises(ValueError, match=r"with the loss MSELoss dptrain knows no accuracy.*metrics=\{'acc'"):
        metrics_named(["accuracy"], "mse", None)
    with pytest.raises(ValueError, match="with a step function dptrain knows no accuracy"):
        metrics_named(["accuracy"], None, lambda model, batch: model(batch).sum())
    with pytest.raises(ValueError, match=r"unknown metric 'auc'.*torchmetrics.AUROC"):
        metrics_named(["auc"], "bce", None)
    with pytest.raises(ValueError, match="did you mean 'accuracy'"):
        metrics_named(["acuracy"], None, None)
    with pytest.raises(TypeError, match="Keras's names .* got int"):
        metrics_named(["accuracy", 3], None, None)
    with pytest.raises(ValueError, match="knows no accuracy"):     # from fit, before anything runs
        dptrain.fit(nn.Linear(4, 1), (X, VALUES), loss="mse", metrics=["accuracy"], log=None)


@pytest.mark.parametrize("devices", [1, 2])
def test_error_metrics_of_a_binary_classifier_on_logits_are_its_probabilities(devices):
    """Keras's ``metrics=["mse"]`` beside binary cross-entropy is the Brier score of its
    sigmoid outputs; with BCEWithLogitsLoss it compared the logits with the labels."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    result = dptrain.fit(model, (X, BINARY), (X, BINARY), loss="bce", metrics=["mse", "mae"], epochs=1,
                         batch_size=8, devices=devices, log=None)
    with torch.no_grad():
        p = torch.sigmoid(model(X))
    assert result["test_mse"] == pytest.approx(((p - BINARY) ** 2).mean().item(), rel=1e-6)
    assert result["test_mae"] == pytest.approx((p - BINARY).abs().mean().item(), rel=1e-6)
    probabilities = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())      # BCELoss: its outputs are probabilities
    figures = dptrain.evaluate(probabilities, (X, BINARY), loss=nn.BCELoss(), metrics=["mse"], devices=devices)
    with torch.no_grad():
        assert figures["test_mse"] == pytest.approx(((probabilities(X) - BINARY) ** 2).mean().item(), rel=1e-6)
