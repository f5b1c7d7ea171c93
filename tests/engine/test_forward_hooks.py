"""Forward hooks of the user's that keep a layer's output for the step (an auxiliary head, a
feature distillation, embeddings collected in predict) on several devices of one process:
their forwards in turn, so each step reads its own device's (engine/forward_hooks.py). They
failed: "Trying to backward through the graph a second time", batch sizes that do not match."""
import functools
import time
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import dptrain
from dptrain.engine.forward_hooks import TurnsError, user_hooks
from dptrain.run import auto_devices

g = torch.Generator().manual_seed(0)
X = torch.randn(256, 8, generator=g, dtype=torch.float64)
Y = (X[:, :2].sum(1) > 0).long() + (X[:, 2] > 0.5).long()
EPOCHS, BATCH = 3, 32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head, self.aux = nn.Linear(32, 3), nn.Linear(32, 3)
        self.double()

    def forward(self, x):
        return self.head(self.body(x))


def hooked(pre=False, pause=0.0):
    """A model whose hook keeps the body's output (or, as a pre-hook, the head's input) for the step;
    ``pause``: seconds between the forward and the read (concurrent forwards would overwrite it then)."""
    net, kept = Net(), {}
    if pre:
        net.head.register_forward_pre_hook(lambda module, inputs: kept.__setitem__("body", inputs[0]))
    else:
        net.body.register_forward_hook(lambda module, inputs, output: kept.__setitem__("body", output))

    def step(model, batch):
        x, y = batch
        out = model(x)
        time.sleep(pause)
        return nn.functional.cross_entropy(out, y) + 0.5 * nn.functional.cross_entropy(model.aux(kept["body"]), y)
    return net, step


def plain(pre=False):
    net, step = hooked(pre)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(EPOCHS):
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            step(net, (X[i:i + BATCH], Y[i:i + BATCH])).backward()
            opt.step()
    with torch.no_grad():
        test_loss = step(net.eval(), (X[:64], Y[:64])).item()
    return net, test_loss


@pytest.mark.parametrize("devices, pre", [(1, False), (2, False), (3, False), (2, True)])
def test_a_hook_keeping_features_for_the_step_trains_as_the_plain_loop(devices, pre):
    reference, test_loss = plain(pre)
    net, step = hooked(pre, pause=0.002)
    lines = []
    result = dptrain.fit(net, (X, Y), (X[:64], Y[:64]), step=step, optimizer=functools.partial(
        torch.optim.SGD, lr=0.1, momentum=0.9), epochs=EPOCHS, batch_size=BATCH, shuffle=False, devices=devices,
        log=lines.append, progress=False)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(net.state_dict()[key], value, rtol=1e-12, atol=1e-12, msg=key)
    assert result["test_loss"] == pytest.approx(test_loss, rel=1e-12)     # the evaluation's steps in turn too
    said = [line for line in lines if "forward hooks of yours" in line]
    if devices == 1:
        assert said == []
    else:
        where = "head (pre): hooked.<locals>.<lambda>" if pre else "body: hooked.<locals>.<lambda>"
        assert said == [f"dptrain: the model has forward hooks of yours ({where}): on {devices} devices of a process "
                        f"their forwards run one after another, so that a hook keeping a layer's output gives each "
                        f"device's step its own (the backward passes still run at once)"]


def test_predict_on_several_devices_collects_a_hooks_outputs_in_the_datas_order():
    net, collected = Net(), []
    net.body.register_forward_hook(lambda module, inputs, output: collected.append(output))
    outputs = dptrain.predict(net, X, batch_size=BATCH, devices=3)
    embeddings = torch.cat(collected)
    with torch.no_grad():
        torch.testing.assert_close(embeddings, net.body(X), rtol=1e-12, atol=1e-12)    # (in thread order: O(1) off)
    assert outputs.shape == (len(X), 3)


class Keeper:
    def keep(self, module, inputs, output):
        pass


def test_hooks_of_the_users_are_found_and_torchs_own_are_not():
    net = Net()
    net.body.register_forward_hook(functools.partial(lambda name, m, i, o: None, "body"))
    net.head.register_forward_pre_hook(lambda m, i: None)
    net.register_forward_hook(Keeper().keep)
    assert user_hooks(net) == ["model: Keeper.keep", "body: test_hooks_of_the_users_are_found_and_torchs_own_are_not"
                               ".<locals>.<lambda>",
                               "head (pre): test_hooks_of_the_users_are_found_and_torchs_own_are_not.<locals>.<lambda>"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # (the old weight_norm's and eager quantization's deprecations)
        torch_own = nn.Sequential(nn.utils.spectral_norm(nn.Linear(4, 4)), nn.utils.weight_norm(nn.Linear(4, 4)))
        prune.l1_unstructured(torch_own[0], "bias", 0.5)
        import torch.ao.quantization as quantization
        qat = nn.Sequential(quantization.QuantStub(), nn.Linear(4, 4), quantization.DeQuantStub()).train()
        qat.qconfig = quantization.get_default_qat_qconfig("x86")
        qat = quantization.prepare_qat(qat)         # (its observers run as forward hooks)
    assert user_hooks(torch_own) == [] and user_hooks(qat) == []


def bn_hooked():
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).double()
    net[2].register_forward_hook(lambda module, inputs, output: None)
    return net


def test_with_forwards_that_wait_for_each_other_it_is_an_error_naming_the_fixes():
    with pytest.raises(TurnsError, match=r"forward hooks of yours \(2: bn_hooked.<locals>.<lambda>\).* "
                                         r"sync_batchnorm's BatchNorm waits for every device inside the forward, so "
                                         r"they cannot. Train on one device \(devices=1\), or as processes"):
        dptrain.fit(bn_hooked(), (X, Y), epochs=1, batch_size=BATCH, devices=2, sync_batchnorm=True, log=None,
                    progress=False)


def test_devices_auto_keeps_one_device_for_hooks_with_a_whole_batch_loss(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)         # the virtual devices would win, were they measured
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)
    net = bn_hooked()
    result = dptrain.fit(net, (X, Y), epochs=1, batch_size=BATCH, optimizer=torch.optim.SGD, lr=0.1, progress=False,
                         loss=dptrain.whole_batch(nn.functional.cross_entropy))
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    assert result["devices"] == ["cpu:0"]
    assert said == ["dptrain: devices auto: cpu:0: the model has forward hooks of yours, which 2 virtual devices would "
                    "run in turn, and a whole_batch loss waits for every device inside the forward; pass devices= to "
                    "choose"]


class RegistersHooks(dptrain.Callback):
    """Registers, in on_fit_start, a hook keeping the body's output for the step (and, with
    ``stats``, one counting the samples each forward of the body sees); removes the latter after
    ``remove_after`` steps."""
    def __init__(self, kept, stats=False, remove_after=None, with_kwargs=False):
        self.kept, self.stats, self.remove_after, self.with_kwargs = kept, stats, remove_after, with_kwargs
        self.seen, self.handle = [], None

    def on_fit_start(self, run):
        if self.with_kwargs:
            run.model.body.register_forward_hook(lambda m, args, kwargs, out: self.kept.__setitem__("body", out),
                                                 with_kwargs=True)
        else:
            run.model.body.register_forward_hook(lambda m, i, out: self.kept.__setitem__("body", out))
        if self.stats:
            self.handle = run.model.body.register_forward_pre_hook(
                lambda m, inputs: self.seen.append(len(inputs[0])) if m.training else None)

    def on_batch_end(self, run, batch):
        if self.remove_after is not None and batch.step == self.remove_after:
            self.handle.remove()


def kept_step(kept):
    def step(model, batch):
        x, y = batch
        out = model(x)
        time.sleep(0.002)       # (concurrent forwards would overwrite the kept features then)
        body = kept.pop("body", None)       # (none in fit's trial of the model, before on_fit_start)
        loss = nn.functional.cross_entropy(out, y)
        return loss if body is None else loss + 0.5 * nn.functional.cross_entropy(model.aux(body), y)
    return step


@pytest.mark.parametrize("devices, with_kwargs", [(1, False), (2, False), (3, False), (2, True)])
def test_hooks_a_callback_registers_are_on_every_device_and_train_as_the_plain_loop(devices, with_kwargs):
    reference, test_loss = plain()
    kept, lines = {}, []
    net = Net()
    result = dptrain.fit(net, (X, Y), (X[:64], Y[:64]), step=kept_step(kept), optimizer=functools.partial(
        torch.optim.SGD, lr=0.1, momentum=0.9), epochs=EPOCHS, batch_size=BATCH, shuffle=False, devices=devices,
        log=lines.append, progress=False, callbacks=[RegistersHooks(kept, with_kwargs=with_kwargs)])
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(net.state_dict()[key], value, rtol=1e-12, atol=1e-12, msg=key)
    assert result["test_loss"] == pytest.approx(test_loss, rel=1e-12)
    said = [line for line in lines if "forward hooks of yours" in line]
    assert said == ([] if devices == 1 else [
        f"dptrain: a callback registered forward hooks of yours (body: RegistersHooks.on_fit_start.<locals>.<lambda>): "
        f"on {devices} devices of a process their forwards run one after another, so that a hook keeping a layer's "
        f"output gives each device's step its own (the backward passes still run at once) and every device's copy of "
        f"the model has them"])


def test_a_hook_a_callback_removes_is_removed_from_every_device():
    kept = {}
    callback = RegistersHooks(kept, stats=True, remove_after=3)
    dptrain.fit(Net(), (X, Y), step=kept_step(kept), epochs=1, batch_size=BATCH, shuffle=False, devices=2, log=None,
                progress=False, callbacks=[callback])
    assert callback.seen == [BATCH // 2] * 6      # 3 steps, each device's part (it saw device 0's alone: 3 x 16)


def test_a_hook_registered_mid_run_where_forwards_wait_is_an_error_naming_the_fixes():
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).double()
    hooks = type("Hooks", (dptrain.Callback,), {"on_fit_start": lambda self, run: run.model[2].register_forward_hook(
        lambda m, i, o: None)})()
    with pytest.raises(TurnsError, match=r"forward hooks of yours \(2: .*<lambda>\).* sync_batchnorm's BatchNorm waits"):
        dptrain.fit(net, (X, Y), epochs=1, batch_size=BATCH, devices=2, sync_batchnorm=True, log=None,
                    progress=False, callbacks=[hooks])
