"""evaluating(): eval mode inside, each module's own mode back after."""
import pytest
from torch import nn

from dptrain.core.modes import evaluating


def test_each_modules_mode_comes_back_a_frozen_batchnorm_too():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Dropout(0.5))
    net[1].eval()                                       # frozen by the user
    with evaluating(net):
        assert not any(m.training for m in net.modules())
    assert [m.training for m in net.modules()] == [True, True, False, True]


def test_modes_come_back_when_the_block_fails():
    nets = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)) for _ in range(2)]
    nets[1][1].eval()
    with pytest.raises(RuntimeError):
        with evaluating(*nets):
            raise RuntimeError("a failing evaluation")
    assert [[m.training for m in n.modules()] for n in nets] == [[True, True, True], [True, True, False]]
