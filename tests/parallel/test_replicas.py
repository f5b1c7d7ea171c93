import functools

import pytest
import torch
from torch import nn

import dptrain
from dptrain.models import GluonLeNet, init_normal
from dptrain.parallel.replicas import NotInitializedError
from tests.parallel.plain_loop import plain_steps

DEVICES = [dptrain.cpu(0), dptrain.cpu(1)]


def test_one_module_per_device_with_equal_parameters():
    net = GluonLeNet()
    replicas = dptrain.replicate(net, DEVICES, init=init_normal)
    assert len(replicas) == 2 and replicas[0] is net and replicas[1] is not net
    w = replicas.param("0.weight")
    assert w.list_devices() == DEVICES
    torch.testing.assert_close(w.data(dptrain.cpu(0)), w.data("cpu:1"), rtol=0, atol=0)
    assert w.data(dptrain.cpu(1)).data_ptr() != w.data(dptrain.cpu(0)).data_ptr()
    assert 0.008 < w.data("cpu:0").std().item() < 0.012          # init ran


def test_asking_for_another_device_names_the_devices_it_lives_on():
    replicas = dptrain.replicate(GluonLeNet(), DEVICES)
    with pytest.raises(ValueError, match=r"'0.weight' is not on cpu:2; it lives on \[cpu:0, cpu:1\]"):
        replicas.param("0.weight").data(dptrain.cpu(2))
    with pytest.raises(ValueError, match=r"lives on \[cpu:0, cpu:1\]: name one, e.g. .data\(cpu:0\)"):
        replicas.param("0.weight").data()
    with pytest.raises(KeyError, match="no parameter '0.wieght'; the model has 0.weight, 0.bias"):
        replicas.param("0.wieght")


def test_lazy_modules_need_one_batch_first_then_are_equal_everywhere():
    net = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
    replicas = dptrain.replicate(net, DEVICES)
    with pytest.raises(NotInitializedError, match="run one batch first"):
        replicas.param("0.weight").data(dptrain.cpu(0))
    out = replicas.forward(dptrain.split_and_load(torch.rand(4, 1, 8, 8), DEVICES))
    assert [o.shape for o in out] == [(2, 10), (2, 10)]
    for name, p in replicas.named_parameters().items():
        torch.testing.assert_close(p.data("cpu:0"), p.data("cpu:1"), rtol=0, atol=0)


def test_forward_backward_fills_each_replicas_gradients():
    replicas = dptrain.replicate(GluonLeNet(), DEVICES)
    X, y = torch.rand(6, 1, 28, 28), torch.arange(6)
    losses = replicas.forward_backward(*dptrain.split_batch(X, y, DEVICES))
    assert len(losses) == 2 and all(loss.item() > 0 for loss in losses)
    g0, g1 = replicas.param("0.weight").grad("cpu:0"), replicas.param("0.weight").grad("cpu:1")
    assert g0 is not None and g1 is not None and not torch.equal(g0, g1)


def test_shards_must_match_devices():
    replicas = dptrain.replicate(GluonLeNet(), DEVICES)
    with pytest.raises(ValueError, match="got 3 shards for 2 devices"):
        replicas.forward([torch.rand(1, 1, 28, 28)] * 3)


def test_the_users_model_keeps_working():
    net = GluonLeNet()
    replicas = dptrain.replicate(net, DEVICES, sync_batchnorm=True)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    X, y = torch.rand(4, 1, 28, 28), torch.arange(4)
    replicas.forward_backward(*dptrain.split_batch(X, y, DEVICES))
    trainer.step(4)
    assert net(X).shape == (4, 10)                      # and it is the trained replica 0
    torch.testing.assert_close(net[0].weight.detach(), replicas.param("0.weight").data("cpu:1"))


def test_replicate_needs_a_module():
    with pytest.raises(TypeError, match="needs an nn.Module, got function"):
        dptrain.replicate(lambda x: x, DEVICES)


def test_a_device_listed_twice_is_two_replicas_on_it():
    """The Gluon tutorial's [mx.cpu(), mx.cpu()] on a machine without GPU: two replicas on
    cpu:0, each with its thread; they train as one device does on the whole batch."""
    import torch.nn.functional as F
    devices = [dptrain.cpu(0), dptrain.cpu(0)]
    X, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    parts = dptrain.split_and_load(X, devices)
    assert [p.shape[0] for p in parts] == [3, 3]
    torch.manual_seed(0)
    one = nn.Linear(4, 3)
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    replicas = dptrain.replicate(net, devices)
    assert replicas[0] is not replicas[1] and len(dptrain.get_runner(devices)._workers) == 2
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.5})
    replicas.forward_backward(*dptrain.split_batch(X, y, devices))
    trainer.step(6)
    F.cross_entropy(one(X), y).backward()
    with torch.no_grad():
        for p in one.parameters():
            p -= 0.5 * p.grad
    for p, q in zip(one.parameters(), net.parameters()):
        torch.testing.assert_close(p, q)
    torch.testing.assert_close(replicas.param("weight").data(dptrain.cpu(0)), net.weight.detach())


@pytest.mark.parametrize("devices", ["cpu:0,cpu:1", "cpu:0,cpu:1,cpu:2"])
def test_a_gradient_hook_on_a_parameter_runs_on_every_device(devices):
    """A mask of pruned weights as a hook on the weight's gradient (``p.register_hook``): every
    replica runs it, so the masked weights stay as they were and the rest train as the plain
    loop trains them (a copy without it added its device's unmasked gradient)."""
    mask = (torch.arange(96).reshape(16, 6) % 3 == 0).float()

    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
        net[0].weight.register_hook(lambda grad: grad * mask)
        return net
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 6, generator=g), torch.randint(0, 2, (64,), generator=g)
    model, plain = make(), make()
    before = model[0].weight.detach().clone()
    dptrain.fit(model, (X, y), epochs=1, batch_size=16, shuffle=False, devices=devices, log=None,
                optimizer=functools.partial(torch.optim.SGD, lr=0.5))
    plain_steps(plain, torch.optim.SGD(plain.parameters(), lr=0.5), X, y)
    assert torch.equal(model[0].weight[mask == 0], before[mask == 0])
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("devices", ["cpu:0,cpu:1", "cpu:0,cpu:1,cpu:2"])
def test_a_pruned_model_trains_on_every_device_as_the_plain_loop(devices):
    """``torch.nn.utils.prune`` keeps ``weight`` (``weight_orig * weight_mask``) as a plain
    attribute that is not a leaf, which ``copy.deepcopy`` refuses: the copies get it detached
    and recompute it at their first forward, so the pruned weights stay zero on every device."""
    import torch.nn.utils.prune as prune

    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
        prune.l1_unstructured(net[0], "weight", amount=0.5)
        return net
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 6, generator=g), torch.randint(0, 2, (64,), generator=g)
    model, plain = make(), make()
    dptrain.fit(model, (X, y), epochs=2, batch_size=16, shuffle=False, devices=devices, log=None,
                optimizer=functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9))
    plain_steps(plain, torch.optim.SGD(plain.parameters(), lr=0.5, momentum=0.9), X, y, epochs=2)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    model(X)        # the pre-hook computes weight again: half of it pruned, as before training
    assert int((model[0].weight == 0).sum()) == 48


def test_a_model_that_cannot_be_copied_is_named_with_the_fix():
    import threading

    class Locked(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(2, 2)
            self.body.guard = threading.Lock()      # (a lock cannot be deep-copied)

    with pytest.raises(TypeError, match="cannot be copied for each device .*attribute 'body.guard'.*one device"):
        dptrain.replicate(Locked(), DEVICES)
    assert len(dptrain.replicate(Locked(), DEVICES[:1])) == 1        # one device copies nothing


def test_attributes_set_on_parameters_are_on_every_copy():
    net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    net[0].weight.no_weight_decay, net[1].bias.mask = True, torch.ones(1)
    replicas = dptrain.replicate(net, DEVICES)
    assert replicas[1][0].weight.no_weight_decay is True and not hasattr(replicas[1][0].bias, "no_weight_decay")
    assert torch.equal(replicas[1][1].bias.mask, torch.ones(1)) and replicas[1][1].bias.mask is not net[1].bias.mask


def test_a_post_accumulate_grad_hook_on_a_parameter_runs_on_every_device():
    """``p.register_post_accumulate_grad_hook(fn)`` set on the model before ``fit`` (a gradient
    scaled in place): every copy runs it, or the sum mixes hooked and unhooked gradients
    (2.8e-2 off the plain loop on 2 devices before)."""
    def halve(p):
        p.grad.mul_(0.5)

    def net():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        model[0].weight.register_post_accumulate_grad_hook(halve)
        return model
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(48, 4, generator=g), torch.randint(0, 2, (48,), generator=g)
    model, plain = net(), net()
    dptrain.fit(model, (X, y), epochs=2, batch_size=16, shuffle=False, devices=2, log=None,
                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5))
    plain_steps(plain, torch.optim.SGD(plain.parameters(), lr=0.5), X, y, batch_size=16, epochs=2)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
