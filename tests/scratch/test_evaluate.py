import pytest
import torch

import dptrain
from dptrain.data import ArrayLoader


def model(X):
    return torch.nn.functional.one_hot(X[:, 0].long() % 10, 10).float()


def data(n, batch_size):
    X = torch.arange(n).float().reshape(n, 1)
    y = torch.arange(n) % 10
    y[::3] = (y[::3] + 1) % 10      # every third prediction is wrong
    return ArrayLoader(X, y, batch_size), n - len(range(0, n, 3))


@pytest.mark.parametrize("n_devices", [1, 2, 3])
def test_sums_correct_and_count_over_devices(n_devices):
    loader, correct = data(101, 10)
    devices = [dptrain.cpu(i) for i in range(n_devices)]
    assert dptrain.count_correct(model, loader, devices) == (correct, 101)
    assert dptrain.evaluate_accuracy(model, loader, devices) == pytest.approx(correct / 101)


def test_last_batch_smaller_than_the_device_count():
    loader, correct = data(9, 4)          # batches of 4, 4, 1 on 3 devices
    assert dptrain.count_correct([model] * 3, loader, [dptrain.cpu(i) for i in range(3)]) == (correct, 9)


def test_one_model_per_device_or_one_for_all():
    loader, _ = data(10, 5)
    with pytest.raises(ValueError, match="got 2 models for 3 devices"):
        dptrain.count_correct([model, model], loader, [dptrain.cpu(i) for i in range(3)])
    with pytest.raises(ValueError, match="no samples"):
        dptrain.evaluate_accuracy(model, [], [dptrain.cpu(0)])


def test_replicas_are_evaluated_in_eval_mode_on_their_own_devices():
    from torch import nn
    net = nn.Sequential(nn.Flatten(), nn.Linear(1, 10), nn.BatchNorm1d(10))
    replicas = dptrain.replicate(net, [dptrain.cpu(0), dptrain.cpu(1)])
    loader, _ = data(20, 5)
    expected = dptrain.count_correct(lambda X: net.eval()(X), loader, [dptrain.cpu(0)])
    net.train()
    assert dptrain.count_correct(replicas, loader) == expected
    assert all(m.training for m in replicas)        # modes restored
