"""``CombinedOptimizer``: several optimizers on one loss stepped as one. It steps as its parts
do in a plain loop, its state dict is one optimizer's layout and loads back, and a Trainer on
1-3 devices, every kvstore, with clipping over every parameter, takes the plain loop's steps."""
import copy
import warnings

import pytest
import torch
from torch import nn

import dptrain
from dptrain import CombinedOptimizer


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def parts(model, lr=0.1):
    """SGD with momentum for the weights, Adam for the biases (kinds whose state differs)."""
    weights = [p for p in model.parameters() if p.ndim == 2]
    biases = [p for p in model.parameters() if p.ndim == 1]
    return {"sgd": torch.optim.SGD(weights, lr=lr, momentum=0.9), "adam": torch.optim.Adam(biases, lr=0.05)}


def batches(n=4, size=12):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)) for _ in range(n)]


def plain(model, optimizers, data, max_norm=None):
    for X, y in data:
        nn.functional.cross_entropy(model(X), y).backward()
        if max_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        for o in optimizers.values():
            o.step()
            o.zero_grad()
    return model


def assert_same(a, b, tol=1e-6):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)


def test_it_steps_each_part_as_a_plain_loop_does():
    want_model = net()
    plain(want_model, parts(want_model), batches())
    model = net()
    combined = CombinedOptimizer(parts(model))
    for X, y in batches():
        loss = combined.step(lambda: nn.functional.cross_entropy(model(X), y).backward() or torch.tensor(1.0))
        assert loss == 1.0          # a closure's loss is returned
        combined.zero_grad()
    assert_same(model, want_model)
    assert all(p.grad is None for p in model.parameters())
    assert combined.label == "SGD+Adam" and len(combined.param_groups) == 2


def test_its_state_dict_is_one_optimizers_and_loads_into_another_that_goes_on_alike():
    model = net()
    combined = CombinedOptimizer(parts(model))
    plain(model, combined.optimizers, batches(2))
    state = copy.deepcopy(combined.state_dict())      # (torch aliases what it loads, as for any optimizer)
    assert sorted(state["state"]) == [0, 1, 2, 3] and [g["params"] for g in state["param_groups"]] == [[0, 1], [2, 3]]
    assert set(state["state"][0]) == {"momentum_buffer"} and "exp_avg" in state["state"][2]
    assert len(combined.state) == 4 and set(combined.state) == set(model.parameters())

    other = copy.deepcopy(model)
    loaded = CombinedOptimizer(parts(other))
    loaded.load_state_dict(state)
    plain(model, combined.optimizers, batches(2))
    plain(other, loaded.optimizers, batches(2))
    assert_same(other, model)
    with pytest.raises(ValueError, match="2 parameter groups, this SGD\\+Adam\\+SGD has 3"):
        three = parts(net())
        three["sgd2"] = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)
        CombinedOptimizer(three).load_state_dict(state)


def test_a_list_is_named_by_class_and_bad_input_is_refused_with_the_fix():
    model = net()
    w1, b1, w2, b2 = model.parameters()
    assert list(CombinedOptimizer([torch.optim.SGD([w1], lr=0.1), torch.optim.SGD([w2], lr=0.1),
                                   torch.optim.Adam([b1, b2])]).optimizers) == ["sgd", "sgd_1", "adam"]
    with pytest.raises(ValueError, match="is in optimizer\\['a'\\] and optimizer\\['b'\\]"):
        CombinedOptimizer({"a": torch.optim.SGD([w1], lr=0.1), "b": torch.optim.Adam([w1, b1])})
    with pytest.raises(TypeError, match="optimizer\\['a'\\] must be an optimizer built on"):
        CombinedOptimizer({"a": torch.optim.SGD})
    with pytest.raises(ValueError, match="at least one"):
        CombinedOptimizer([])
    combined = CombinedOptimizer(parts(model))
    with pytest.raises(ValueError, match="optimizers\\[name\\].add_param_group"):
        combined.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})


@pytest.mark.parametrize("devices, kvstore", [(1, "device"), (2, "device"), (3, "device"), (2, "local"),
                                              (3, "ring")])
def test_a_trainer_takes_the_plain_loops_steps_clipping_over_every_parameter(devices, kvstore):
    want = net()
    want_optimizers = parts(want)
    plain(want, want_optimizers, batches(), max_norm=0.5)
    model = net()
    user = parts(model)
    replicas = dptrain.replicate(model, [dptrain.cpu(0)] * devices)
    given = user if devices == 2 else CombinedOptimizer(user)        # (the dict itself: combined by the Trainer)
    trainer = dptrain.Trainer(replicas, given, kvstore=kvstore)
    for X, y in batches():
        Xs, ys = dptrain.split_batch(X, y, replicas.devices)
        trainer.step_with(lambda i: nn.functional.cross_entropy(replicas[i](Xs[i]), ys[i], reduction="sum").backward(),
                          len(X), max_norm=0.5)
    assert_same(replicas[0], want, 1e-5)
    assert trainer.optimizer_name == "SGD+Adam"
    trainer.close()          # the state goes back to the user's optimizers, which go on as the plain loop's
    plain(model, user, batches(2))
    plain(want, want_optimizers, batches(2))
    assert_same(model, want, 1e-5)


def test_each_part_takes_a_scheduler_of_its_own_in_a_loop_of_yours():
    want = net()
    want_optimizers = parts(want)
    want_schedulers = [torch.optim.lr_scheduler.StepLR(want_optimizers["sgd"], 1, gamma=0.5),
                       torch.optim.lr_scheduler.CosineAnnealingLR(want_optimizers["adam"], T_max=4)]
    for batch in batches():
        plain(want, want_optimizers, [batch])
        for s in want_schedulers:
            s.step()
    model = net()
    replicas = dptrain.replicate(model, [dptrain.cpu(0)] * 2)
    trainer = dptrain.Trainer(replicas, parts(model))
    sgd, adam = trainer.optimizer.parts["sgd"], trainer.optimizer.parts["adam"]
    assert sgd.param_groups[0] is trainer.optimizer.param_groups[0] and adam.param_groups == \
        trainer.optimizer.param_groups[1:]
    schedulers = [torch.optim.lr_scheduler.StepLR(sgd, 1, gamma=0.5),
                  torch.optim.lr_scheduler.CosineAnnealingLR(adam, T_max=4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # (a part not seen stepped: "lr_scheduler.step() before optimizer.step()")
        for X, y in batches():
            Xs, ys = dptrain.split_batch(X, y, replicas.devices)
            trainer.step_with(lambda i: nn.functional.cross_entropy(replicas[i](Xs[i]), ys[i], reduction="sum")
                              .backward(), len(X))
            for s in schedulers:
                s.step()
    assert_same(replicas[0], want, 1e-5)
    assert trainer.learning_rates == {"sgd": pytest.approx(0.1 * 0.5 ** 4), "adam": pytest.approx(0.0)}
    with pytest.raises(ValueError, match="add the group to your optimizer before fit"):
        sgd.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})
    with pytest.raises(ValueError, match="trainer.optimizer.zero_grad\\(\\)"):
        adam.zero_grad()
    single = dptrain.Trainer(dptrain.replicate(net(), [dptrain.cpu(0)]), "sgd", {"learning_rate": 0.1})
    assert single.optimizer.parts == {}
