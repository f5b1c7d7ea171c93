"""What a callback does to ``run.model`` holds on every device, as in the plain loop: weights
it edits in place (a max-norm constraint, ``load_state_dict``), attributes it schedules, layers
it freezes (and unfreezes: ``test_unfreezing.py``); fine-tuning in phases, one ``fit`` each,
trains exactly as the plain loop does."""
import functools
import math

import pytest
import torch
from torch import nn

import dptrain


def data(n=192):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def model(frozen: bool):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    m[0].requires_grad_(not frozen)
    return m


def fit(net, devices, epochs, callbacks=(), optimizer=None, **kw):
    return dptrain.fit(net, data(), eval_data=kw.pop("eval_data", None), loss=nn.CrossEntropyLoss(), shuffle=False,
                       optimizer=optimizer or functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                       epochs=epochs, batch_size=64, devices=devices, callbacks=list(callbacks), log=None, **kw)


def max_norm_(layer, limit=0.3):
    """Keras's ``MaxNorm`` constraint: each unit's incoming weights scaled to a norm of at most ``limit``."""
    with torch.no_grad():
        w = layer.weight
        w.mul_(limit / w.norm(dim=1, keepdim=True).clamp(min=limit))


class MaxNorm(dptrain.Callback):
    def on_batch_end(self, run, batch):
        max_norm_(run.model[2])


class ResetHead(dptrain.Callback):
    """At epoch 2's start, the head back to its initial weights, by ``load_state_dict``."""

    def __init__(self, net):
        self.initial = {k: v.clone() for k, v in net[2].state_dict().items()}

    def on_epoch_start(self, run, epoch):
        if epoch == 2:
            run.model[2].load_state_dict(self.initial)


def plain(epochs, after_batch=None, at_epoch_start=None):
    net, (X, y) = model(frozen=False), data()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(1, epochs + 1):
        if at_epoch_start:
            at_epoch_start(net, epoch)
        for i in range(0, len(X), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(X[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
            if after_batch:
                after_batch(net)
    return net


def assert_same(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("devices", [1, 2, 3])
def test_weights_a_callback_constrains_after_each_batch_are_every_devices(devices, kvstore):
    """On 2 devices the constraint reached the first device's copy only: the weights ended
    0.01-0.05 from the plain loop's."""
    net = model(frozen=False)
    fit(net, devices, 3, [MaxNorm()], kvstore=kvstore)
    assert_same(net, plain(3, after_batch=lambda n: max_norm_(n[2])))


@pytest.mark.parametrize("devices", [1, 2])
def test_weights_a_callback_loads_into_run_model_are_every_devices(devices):
    net = model(frozen=False)
    reset = ResetHead(net)
    fit(net, devices, 3, [reset])
    assert_same(net, plain(3, at_epoch_start=lambda n, e: e == 2 and n[2].load_state_dict(reset.initial)))


class ZeroHeadForEvaluation(dptrain.Callback):
    def on_evaluate_start(self, run, epoch):
        self.kept = {k: v.clone() for k, v in run.model[2].state_dict().items()}
        with torch.no_grad():
            run.model[2].weight.zero_()
            run.model[2].bias.zero_()

    def on_evaluate_end(self, run, epoch, metrics):
        run.model[2].load_state_dict(self.kept)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_an_evaluation_scores_the_weights_a_callback_set_for_it_on_every_device(devices):
    """Zero logits on every device: a loss of log(3) over the whole set; then training goes on as before."""
    net = model(frozen=False)
    result = fit(net, devices, 2, [ZeroHeadForEvaluation()], eval_data=data(90), eval_every_n_steps=2)
    assert [round(h["test_loss"], 6) for h in result["history"]] == [round(math.log(3), 6)] * 2
    assert_same(net, plain(2))


class FreezeThenThaw(dptrain.Callback):
    """The first layer frozen for epoch 2, trained again from epoch 3 (it trained at the start)."""

    def __init__(self, net):
        self.net = net

    def on_epoch_start(self, run, epoch):
        self.net[0].requires_grad_(epoch != 2)


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("devices", [1, 2, 3])
def test_layers_frozen_mid_run_and_trained_again_as_in_the_plain_loop(devices, kvstore):
    """A frozen layer is not updated (no gradient: no momentum, no weight decay), then goes on
    with its momentum. Before, on 2 devices, only the first device's copy was frozen and the
    devices' sums disagreed (the head's weights ended 0.05 from the plain loop's)."""
    net = fit_freeze_then_thaw(devices, kvstore)
    assert_same(net, plain_freeze_then_thaw())
    assert all(p.requires_grad for p in net.parameters())


def fit_freeze_then_thaw(devices, kvstore="device"):
    net = model(frozen=False)
    fit(net, devices, 3, [FreezeThenThaw(net)], kvstore=kvstore,
        optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.01))
    return net


def plain_freeze_then_thaw():
    ref, (X, y) = model(frozen=False), data()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for epoch in (1, 2, 3):
        ref[0].requires_grad_(epoch != 2)
        for i in range(0, len(X), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(ref(X[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    return ref


def plain_phases(epochs_frozen, epochs_thawed):
    """The plain loop: the head alone, then everything with a new optimizer."""
    net, (X, y) = model(frozen=True), data()
    for phase, epochs in ((0, epochs_frozen), (1, epochs_thawed)):
        if phase:
            net[0].requires_grad_(True)
        opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1 if not phase else 0.02,
                              momentum=0.9)
        for _ in range(epochs):
            for i in range(0, len(X), 64):
                opt.zero_grad()
                nn.functional.cross_entropy(net(X[i:i + 64]), y[i:i + 64]).backward()
                opt.step()
    return net


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_fine_tuning_in_phases_trains_as_the_plain_loop(devices):
    net = model(frozen=True)
    fit(net, devices, 2)
    net[0].requires_grad_(True)
    fit(net, devices, 1, optimizer=functools.partial(torch.optim.SGD, lr=0.02, momentum=0.9))
    for p, q in zip(net.parameters(), plain_phases(2, 1).parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


class Scaled(nn.Module):
    """A model with a plain attribute its forward reads (a KL weight, a temperature)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net, self.scale = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)), 1.0

    def forward(self, x):
        return self.net(x) * self.scale


class Anneal(dptrain.Callback):
    def on_batch_start(self, run, epoch, batch):
        run.model.scale = 1.0 + 0.25 * (run.step % 5)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_an_attribute_a_callback_schedules_is_every_devices(devices):
    net = Scaled()
    fit(net, devices, 2, [Anneal()])
    ref, (X, y) = Scaled(), data()
    opt, step = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), 0
    for _ in range(2):
        for i in range(0, len(X), 64):
            ref.scale = 1.0 + 0.25 * (step % 5)
            opt.zero_grad()
            nn.functional.cross_entropy(ref(X[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
            step += 1
    assert_same(net, ref)


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))


class FreezeBatchNorm(dptrain.Callback):
    def on_fit_start(self, run):
        run.model[1].eval()


@pytest.mark.parametrize("devices", [1, 2])
def test_a_batchnorm_frozen_once_stays_frozen_through_the_evaluations(devices):
    """Each evaluation ended with model.train(): the frozen BatchNorm trained again from epoch 2 on."""
    net = bn_model()
    result = fit(net, devices, 3, [FreezeBatchNorm()], eval_data=data(90))
    assert not net[1].training and net.training
    ref, (X, y) = bn_model(), data()
    ref[1].eval()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for i in range(0, len(X), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(ref(X[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    assert_same(net, ref)
    assert torch.equal(net[1].running_mean, torch.zeros(16))       # never updated
    assert len(result["history"]) == 3


def test_evaluate_and_predict_give_each_modules_mode_back():
    net = bn_model()
    net[1].eval()
    X, y = data(40)
    dptrain.evaluate(net, (X, y), loss=nn.CrossEntropyLoss(), devices=2)
    dptrain.predict(net, X, devices=2)
    assert [m.training for m in net.modules()] == [True, True, False, True, True]


class Prune(dptrain.Callback):
    """Iterative magnitude pruning by a callback: half the first layer's weights, after epoch 1."""

    def on_epoch_end(self, run, epoch, row):
        if epoch == 1:
            torch.nn.utils.prune.l1_unstructured(run.model[0], "weight", amount=0.5)


def test_a_structure_a_callback_changes_is_refused_on_several_devices_and_trains_between_two_fits():
    """Pruning adds a buffer and a hook to the first copy only: the others trained unpruned and
    the run drifted from the plain loop, silently. Now an error names the fix; one device (one
    copy) trains it, and so do two ``fit`` calls around the change on any number of devices."""
    import torch.nn.utils.prune as prune
    want = plain(2, at_epoch_start=lambda net, epoch: epoch == 2 and prune.l1_unstructured(net[0], "weight", 0.5))
    one = model(frozen=False)
    fit(one, 1, 2, [Prune()], optimizer=torch.optim.SGD(one.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match=r"structure changed during training \(seen in on_epoch_start: '0', a Linear"
                                         r".*call fit again after it"):
        fit(model(frozen=False), 2, 2, [Prune()])
    two = model(frozen=False)
    optimizer = torch.optim.SGD(two.parameters(), lr=0.1, momentum=0.9)
    fit(two, 2, 1, optimizer=optimizer)
    prune.l1_unstructured(two[0], "weight", amount=0.5)
    fit(two, 2, 1, optimizer=optimizer)
    for net in (one, two):
        assert_same(net, want)


class MaskFirstLayer(dptrain.Callback):
    """A hook on a weight's gradient, registered in ``on_fit_start`` and removed after epoch 1."""
    mask = (torch.arange(128).reshape(16, 8) % 3 == 0).float()

    def on_fit_start(self, run):
        self.handle = run.model[0].weight.register_hook(lambda grad: grad * self.mask)

    def on_epoch_end(self, run, epoch, row):
        if epoch == 1:
            self.handle.remove()


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_gradient_hook_a_callback_registers_and_removes_is_every_devices(devices):
    """The copies had only the hooks there when they were made: one registered by a callback
    was on the first device alone, and the others added their unmasked gradients (3.6e-2 off)."""
    net = model(frozen=False)
    fit(net, devices, 2, [MaskFirstLayer()])
    handles = []
    want = plain(2, at_epoch_start=lambda n, epoch: handles.append(
        n[0].weight.register_hook(lambda grad: grad * MaskFirstLayer.mask)) if epoch == 1 else handles[0].remove())
    assert_same(net, want)
