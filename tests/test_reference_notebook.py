"""The cells of the reference notebook that failed on a machine without a GPU (seed 002),
redone with dptrain: each works, or fails with an error that says what to do."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.models import init_normal, resnet18


def test_initialize_on_a_device_list_without_a_gpu():
    # MXNet: net.initialize(init=init.Normal(sigma=0.01), ctx=[mx.gpu(0), mx.gpu(1)]) -> "GPU is not enabled"
    if dptrain.num_gpus() == 0:
        with pytest.raises(ValueError, match="cuda:0 does not exist.*try_gpu"):
            dptrain.gpu(0)
    devices = dptrain.parse_devices("auto")          # GPUs, or cpu:0, cpu:1
    replicas = dptrain.replicate(resnet18(10), devices, init=init_normal)
    assert len(replicas) == len(devices) == 2 or dptrain.num_gpus() == 1


def test_forward_on_every_device():
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    replicas = dptrain.replicate(resnet18(10), devices, init=init_normal)
    x = torch.rand(4, 1, 28, 28)
    out = replicas.forward(dptrain.split_and_load(x, devices))
    assert [o.shape for o in out] == [(2, 10), (2, 10)]


def test_reading_a_parameter_names_the_devices_and_lazy_layers_ask_for_a_batch():
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    # Gluon's deferred initialisation: shapes known only after the first batch.
    net = nn.Sequential(nn.LazyConv2d(64, 3, padding=1), nn.LazyBatchNorm2d(), nn.ReLU())
    replicas = dptrain.replicate(net, devices)
    weight = replicas.param("0.weight")
    with pytest.raises(dptrain.NotInitializedError, match="run one batch first"):
        weight.data(devices[0])
    replicas.forward(dptrain.split_and_load(torch.rand(4, 1, 28, 28), devices))
    with pytest.raises(ValueError, match=r"lives on \[cpu:0, cpu:1\]: name one"):
        weight.data()
    torch.testing.assert_close(weight.data(devices[0])[0], weight.data(devices[1])[0])


def test_the_learning_rate_typo_is_caught():
    # gluon.Trainer(net.collect_params(), 'sgd', {'learning rate': lr}) trained at the default rate.
    replicas = dptrain.replicate(resnet18(10), [dptrain.cpu(0)])
    with pytest.raises(ValueError, match="unknown optimizer_params key.s. 'learning rate' for 'sgd'; "
                                         "valid keys: learning_rate"):
        dptrain.Trainer(replicas, "sgd", {"learning rate": 0.1})


def test_train_on_one_then_two_devices():
    # train(num_gpus=1, batch_size=256, lr=0.1); train(num_gpus=2, batch_size=512, lr=0.2), a few steps.
    for n, batch_size, lr in ((1, 8, 0.1), (2, 16, 0.2)):
        devices = [dptrain.cpu(i) for i in range(n)]
        replicas = dptrain.replicate(resnet18(10), devices, init=init_normal)
        trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": lr})
        X, y = torch.rand(batch_size, 1, 28, 28), torch.randint(0, 10, (batch_size,))
        losses = replicas.forward_backward(*dptrain.split_batch(X, y, devices))
        trainer.step(batch_size)
        assert sum(loss.item() for loss in losses) > 0
        acc = dptrain.evaluate_accuracy(replicas, [(X, y)])
        assert 0.0 <= acc <= 1.0
