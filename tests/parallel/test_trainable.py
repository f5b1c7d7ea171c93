"""What trains: a Trainer of your own loop names a change of requires_grad (or a group added);
fit's Trainer follows one (`Trainer.follow`)."""
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


def test_a_trainer_of_your_own_loop_refuses_a_param_group_added_after_set_up():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    net[0].requires_grad_(False)
    replicas = dptrain.replicate(net, [dptrain.cpu(0), dptrain.cpu(1)])
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="add_param_group on the optimizer of a Trainer in your own loop.*"
                                         "make a new Trainer"):
        trainer.optimizer.add_param_group({"params": list(replicas[0][0].parameters())})
    assert len(trainer.optimizer.param_groups) == 1


def test_a_fit_trainer_rebuilds_for_a_layer_unfrozen_keeping_the_heads_state():
    """``follow``: the per-device optimizers hold the new layer, the head's momentum is the same tensor."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    net[0].requires_grad_(False)
    replicas = dptrain.replicate(net, [dptrain.cpu(0), dptrain.cpu(1)])
    trainer = dptrain.Trainer(replicas, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), kvstore="local")
    trainer.follow_edits()
    X, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    replicas.forward_backward(*dptrain.split_batch(X, y, replicas.devices))
    trainer.step(len(X))
    momenta = [opt.state[replicas[i][1].weight]["momentum_buffer"] for i, opt in enumerate(trainer._optimizers)]
    assert trainer.follow(False) is False                 # nothing changed: nothing rebuilt
    net[0].requires_grad_(True)
    assert trainer.follow(True) is True
    assert all(p.requires_grad for m in replicas for p in m.parameters())
    for i, opt in enumerate(trainer._optimizers):
        held = [p for group in opt.param_groups for p in group["params"]]
        assert len(held) == 4 and opt.state[replicas[i][1].weight]["momentum_buffer"] is momenta[i]
    replicas.forward_backward(*dptrain.split_batch(X, y, replicas.devices))
    before = net[0].weight.detach().clone()
    trainer.step(len(X))
    assert not torch.equal(net[0].weight, before) and torch.equal(replicas[1][0].weight, net[0].weight)
