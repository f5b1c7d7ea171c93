"""The optimizer the user and the schedulers hold: torch's step post-hooks registered on the
optimizer object the user built (or on ``run.optimizer``) run once after each update, as
after the plain loop's ``optimizer.step()``, and what they write on the weights reaches every
device; a step pre-hook, which would need the summed gradients, is refused with the fix."""
import pytest
import torch
from torch import nn

import dptrain
from tests.parallel.plain_loop import plain_steps


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).double()


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(48, 6, generator=g, dtype=torch.float64) * 3, torch.randint(0, 3, (48,), generator=g)


def max_norm(optimizer, args, kwargs):
    """Keras's max-norm constraint on each weight's rows, written through ``.data``."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.dim() == 2:
                p.data.copy_(torch.renorm(p.data, 2, 0, 0.5))


def hooked(model, calls):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    optimizer.register_step_post_hook(max_norm)
    optimizer.register_step_post_hook(lambda o, args, kwargs: calls.append(o.param_groups[0]["lr"]))
    return optimizer


@pytest.mark.parametrize("devices", ["cpu:0", "cpu:0,cpu:1,cpu:2"])
@pytest.mark.parametrize("kvstore", ["device", "local"])
def test_post_hooks_of_the_optimizer_given_run_after_each_update_on_every_device(devices, kvstore):
    model, calls, plain, plain_calls = make(), [], make(), []
    dptrain.fit(model, data(), epochs=2, batch_size=16, shuffle=False, log=None, devices=devices, kvstore=kvstore,
                optimizer=hooked(model, calls))
    plain_steps(plain, hooked(plain, plain_calls), *data(), epochs=2)
    assert calls == plain_calls == [0.05] * 6
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    assert all(row.norm() <= 0.5 + 1e-12 for row in model[0].weight)


def test_a_post_hook_a_callback_registers_on_run_optimizer_runs_too():
    calls = []

    class Registers(dptrain.Callback):
        def on_fit_start(self, run):
            run.optimizer.register_step_post_hook(lambda o, args, kwargs: calls.append(o is run.optimizer))
    dptrain.fit(make(), data(), epochs=1, batch_size=16, log=None, devices="cpu:0,cpu:1", callbacks=[Registers()])
    assert calls == [True] * 3


def test_a_trainer_of_your_own_loop_runs_them_and_keeps_the_replicas_equal():
    model, calls = make(), []
    replicas = dptrain.replicate(model, ["cpu:0", "cpu:1"])
    trainer = dptrain.Trainer(replicas, hooked(model, calls))
    X, y = data()
    for i in range(0, 48, 16):
        Xs, ys = dptrain.split_batch(X[i:i + 16], y[i:i + 16], replicas.devices)
        replicas.forward_backward(Xs, ys)
        trainer.step(16)
    assert len(calls) == 3
    for p, q in zip(replicas[0].parameters(), replicas[1].parameters()):
        assert torch.equal(p, q)


def test_a_pre_hook_is_refused_with_the_fix():
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.register_step_pre_hook(lambda o, args, kwargs: None)
    with pytest.raises(ValueError, match=r"the optimizer SGD has a step pre-hook .*register_step_post_hook"):
        dptrain.fit(model, data(), epochs=1, batch_size=16, log=None, devices="cpu:0", optimizer=optimizer)


def test_a_part_of_several_optimizers_on_one_loss_runs_its_hooks_given_its_part():
    model, seen = make(), []
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters(), lr=0.01)
    second.register_step_post_hook(lambda o, args, kwargs: seen.append(len(o.param_groups[0]["params"])))
    dptrain.fit(model, data(), epochs=1, batch_size=16, log=None, devices="cpu:0,cpu:1",
                optimizer={"body": first, "head": second})
    assert seen == [2] * 3
    first.register_step_pre_hook(lambda o, args, kwargs: None)
    with pytest.raises(ValueError, match=r"the optimizer SGD \('body'\) has a step pre-hook"):
        dptrain.fit(model, data(), epochs=1, batch_size=16, log=None, devices="cpu:0,cpu:1",
                    optimizer={"body": first, "head": second})


def test_the_hooks_of_an_optimizer_a_factory_makes_run_too():
    calls = []

    def adam(params):
        optimizer = torch.optim.Adam(params, lr=0.01)
        optimizer.register_step_post_hook(lambda *_: calls.append(1))
        return optimizer
    dptrain.fit(make(), data(), epochs=1, batch_size=16, log=None, devices="cpu:0,cpu:1", optimizer=adam)
    assert len(calls) == 3
