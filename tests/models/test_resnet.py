import torch
from torch import nn

from dptrain.models import init_normal, resnet18


def test_modified_resnet18_on_28x28():
    net = resnet18(10, in_channels=1)
    stem = net[0]
    assert (stem.kernel_size, stem.stride, stem.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in net.modules())
    assert sum(isinstance(m, nn.Conv2d) for m in net.modules()) == 1 + 16 + 3
    net.eval()
    assert net(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_init_normal():
    net = resnet18()
    init_normal(net, std=0.01)
    assert 0.008 < net[-1].weight.std().item() < 0.012
