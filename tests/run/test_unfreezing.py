"""A layer frozen when ``fit`` starts and unfrozen by a callback mid-run (a backbone after a
few epochs of training the head: Lightning's ``BackboneFinetuning``) trains from the next step
on, as in the plain loop: with an optimizer built on every parameter (the frozen ones train
once unfrozen; several combined too), or with a group added to ``run.optimizer``; every
optimizer state goes on, a resumed run unfreezes as the unbroken one did, and the user's
optimizer ends with the group."""
import functools

import pytest
import torch
from torch import nn

import dptrain
from tests.run.test_callback_edits import assert_same, data, model

EPOCHS, BATCH = 3, 64


def optimizer_for(net, variant):
    """The optimizer a user gives ``fit``, as they would build it for the plain loop."""
    if variant == "all":            # on every parameter, the frozen ones too
        return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    if variant == "adam":
        return torch.optim.Adam(net.parameters(), lr=0.01)
    if variant == "combined":       # several on one loss: the frozen weight in the SGD part
        weights = [p for p in net.parameters() if p.ndim == 2]
        return dptrain.CombinedOptimizer({"sgd": torch.optim.SGD(weights, lr=0.1, momentum=0.9),
                                          "adam": torch.optim.Adam([p for p in net.parameters() if p.ndim == 1],
                                                                   lr=0.01)})
    return torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1, momentum=0.9)   # "group"


def unfreeze(net, optimizer, variant):
    net[0].requires_grad_(True)
    if variant == "group":          # Lightning's BackboneFinetuning: a group of its own, a lower rate
        optimizer.add_param_group({"params": list(net[0].parameters()), "lr": 0.01})


class Unfreeze(dptrain.Callback):
    """Unfreezes the first layer once, in ``hook`` of epoch 2."""

    def __init__(self, net, hook, variant):
        self.net, self.hook, self.variant, self.done = net, hook, variant, False

    def _now(self, run, epoch, hook):
        if hook == self.hook and epoch == 2 and not self.done:
            unfreeze(self.net, run.optimizer, self.variant)
            self.done = True

    def on_epoch_start(self, run, epoch):
        self._now(run, epoch, "on_epoch_start")

    def on_batch_start(self, run, epoch, batch):
        self._now(run, epoch, "on_batch_start")

    def on_batch_end(self, run, batch):
        self._now(run, batch.epoch, "on_batch_end")

    def state_dict(self):
        return {"done": self.done}

    def load_state_dict(self, state):
        self.done = state["done"]


def plain(variant, unfrozen_after, epochs=EPOCHS):
    """The plain loop: the first layer unfrozen after ``unfrozen_after`` steps."""
    net, (X, y) = model(frozen=True), data()
    opt, step = optimizer_for(net, variant), 0
    for _ in range(epochs):
        for i in range(0, len(X), BATCH):
            if step == unfrozen_after:
                unfreeze(net, opt, variant)
            opt.zero_grad()
            nn.functional.cross_entropy(net(X[i:i + BATCH]), y[i:i + BATCH]).backward()
            opt.step()
            step += 1
    return net, opt


def fit(net, devices, variant, hook="on_epoch_start", epochs=EPOCHS, optimizer=None, **kw):
    optimizer = optimizer or optimizer_for(net, variant)
    if variant == "group":          # also as a factory: called on what trains at the start
        optimizer = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9) if optimizer == "factory" else optimizer
    dptrain.fit(net, data(), eval_data=None, loss=nn.CrossEntropyLoss(), shuffle=False, optimizer=optimizer,
                epochs=epochs, batch_size=BATCH, devices=devices, callbacks=[Unfreeze(net, hook, variant)], log=None,
                **kw)
    return optimizer


STEPS_BEFORE = {"on_epoch_start": 3, "on_batch_start": 3, "on_batch_end": 4}     # epoch 1 has 3 batches


@pytest.mark.parametrize("variant", ["all", "group", "adam", "combined"])
@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_layer_unfrozen_mid_run_trains_from_the_next_step_as_in_the_plain_loop(devices, variant):
    net = model(frozen=True)
    fit(net, devices, variant)
    ref, _ = plain(variant, STEPS_BEFORE["on_epoch_start"])
    assert not torch.equal(ref[0].weight, model(frozen=True)[0].weight)       # it did train
    assert_same(net, ref)


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("hook", ["on_batch_start", "on_batch_end"])
def test_unfrozen_in_a_batch_hook_on_two_devices_with_a_factory_and_a_group(hook, kvstore):
    net = model(frozen=True)
    fit(net, 2, "group", hook, optimizer="factory", kvstore=kvstore)
    assert_same(net, plain("group", STEPS_BEFORE[hook])[0])


@pytest.mark.parametrize("variant", ["all", "group"])
def test_the_users_optimizer_ends_with_the_added_group_and_every_state(variant):
    net = model(frozen=True)
    optimizer = fit(net, 2, variant)
    _, ref = plain(variant, 3)
    assert len(optimizer.param_groups) == len(ref.param_groups)
    assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in ref.param_groups]
    ours, theirs = optimizer.state_dict()["state"], ref.state_dict()["state"]
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        torch.testing.assert_close(ours[k]["momentum_buffer"], theirs[k]["momentum_buffer"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", ["all", "group"])
@pytest.mark.parametrize("devices", [1, 2])
def test_a_run_resumed_after_the_unfreezing_goes_on_as_the_unbroken_one(tmp_path, devices, variant):
    net = model(frozen=True)
    fit(net, devices, variant, epochs=2, checkpoint_dir=str(tmp_path))
    resumed = model(frozen=True)            # frozen again, as the script starts it
    fit(resumed, devices, variant, epochs=EPOCHS, checkpoint_dir=str(tmp_path), resume=True)
    assert all(p.requires_grad for p in resumed.parameters())
    assert_same(resumed, plain(variant, 3)[0])


def test_a_layer_unfrozen_that_no_group_holds_stops_the_run_with_the_fix():
    net = model(frozen=True)
    before = net[0].weight.detach().clone()
    with pytest.raises(ValueError, match=r"in on_epoch_start: requires_grad was set on 0.weight, 0.bias, but no "
                                         r"group of the optimizer holds them.*add_param_group.*model.parameters\(\)"):
        fit(net, 2, "factory-without-group", optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    assert torch.equal(net[0].weight, before)        # no step took the unfrozen layer half-way


def test_a_group_of_parameters_a_group_holds_already_is_an_error_naming_why():
    net = model(frozen=True)

    class AddAgain(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            run.optimizer.add_param_group({"params": list(net[0].parameters())})
    with pytest.raises(ValueError, match="in a group of the optimizer already"):
        dptrain.fit(net, data(), loss=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                    epochs=1, batch_size=BATCH, callbacks=[AddAgain()], log=None)
