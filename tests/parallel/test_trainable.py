"""What trains is settled when a Trainer is set up: a change of requires_grad later is named."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.parallel.trainable import TrainableSet


def test_the_set_names_what_changed_in_both_directions():
    net = nn.Sequential(*[nn.Linear(2, 2) for _ in range(4)])
    net[0].requires_grad_(False)
    trainable = TrainableSet(net)
    trainable.check("in here")                                 # unchanged: nothing to say
    net[0].requires_grad_(True)
    for layer in net[1:]:
        layer.requires_grad_(False)
    with pytest.raises(ValueError, match=r"in here \(now trains: 0.weight, 0.bias; now frozen: 1.weight, 1.bias, "
                                         r"2.weight, 2.bias and 2 more\)"):
        trainable.check("in here")


@pytest.mark.parametrize("devices", [1, 2])
def test_a_trainer_refuses_a_step_after_requires_grad_changed(devices):
    torch.manual_seed(0)
    replicas = dptrain.replicate(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)),
                                 [dptrain.cpu(i) for i in range(devices)])
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    X, y = torch.randn(8, 4), torch.randint(0, 2, (8,))

    def step():
        replicas.forward_backward(*dptrain.split_batch(X, y, replicas.devices))
        return trainer.step(len(X))
    assert step()
    replicas[0][0].requires_grad_(False)
    with pytest.raises(ValueError, match=r"between two Trainer.step calls \(now frozen: 0.weight, 0.bias\).*"
                                         r"make a new Trainer"):
        step()
