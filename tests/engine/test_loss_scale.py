"""float16 mixed precision scales the loss as ``torch.amp.GradScaler`` does: on one device a
run takes the plain loop's steps exactly (the overflowing ones skipped, the scale halved); on
any number, gradients too small for float16 train as with the GradScaler; a run resumed goes
on with the scale it had."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.loss_scale import LossScale

BATCH = 64


def data(scale):
    g = torch.Generator().manual_seed(1)
    return torch.randn(256, 8, generator=g) * scale, torch.randint(0, 3, (256,), generator=g)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


def tiny(output, target):
    """A loss whose gradients float16 cannot hold unscaled (a loss weighted 1e-4, say)."""
    return 1e-4 * F.cross_entropy(output, target)


def plain(scale, epochs=2, scaled=True, loss=F.cross_entropy, lr=0.1):
    """The plain loop of torch's AMP recipe: autocast in float16, a GradScaler. Returns the
    model, how many steps the scaler skipped, and its last scale."""
    net, (X, y) = model(), data(scale)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    skipped = 0
    for _ in range(epochs):
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                value = loss(net(X[i:i + BATCH]).float(), y[i:i + BATCH])
            scaler.scale(value).backward()
            before = scaler.get_scale() if scaled else 0.0
            scaler.step(opt)
            scaler.update()
            skipped += scaled and scaler.get_scale() < before
    return net, skipped, scaler.get_scale() if scaled else None


class LastScale(dptrain.Callback):
    def on_fit_end(self, run, result):
        self.scale = run.engine.loss_scale.scale


def fit(net, scale, devices, epochs=2, loss=None, lr=0.1, **kw):
    return dptrain.fit(net, data(scale), loss=loss or nn.CrossEntropyLoss(), optimizer="sgd", lr=lr, amp="fp16",
                       shuffle=False, epochs=epochs, batch_size=BATCH, devices=devices, log=None, **kw)


def largest_difference(a, b):
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("scale", [1e3, 1e4])
def test_fp16_takes_the_steps_of_the_plain_loop_with_a_grad_scaler_overflows_included(scale):
    ref, skipped, last = plain(scale)
    assert skipped == 2                          # the scale began too large: two steps overflowed
    net, scales = model(), LastScale()
    result = fit(net, scale, 1, callbacks=[scales])
    assert largest_difference(net, ref) == 0.0 and scales.scale == last
    assert all(math.isfinite(h["train_loss"]) for h in result["history"])     # an overflow is not a NaN batch


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_gradients_fp16_cannot_hold_unscaled_train_as_with_a_grad_scaler_on_any_devices(devices):
    ref = plain(1.0, loss=tiny, lr=100.0)[0]
    assert largest_difference(plain(1.0, loss=tiny, lr=100.0, scaled=False)[0], ref) > 1e-4
    net = model()
    fit(net, 1.0, devices, loss=tiny, lr=100.0)
    assert largest_difference(net, ref) < 5e-6


def regression():
    g = torch.Generator().manual_seed(1)
    return torch.randn(256, 8, generator=g) * 30, torch.randn(256, 64, generator=g) * 30


def plain_mse():
    """A GradScaler loop on an element-wise mean (MSE over 64 outputs): two steps overflow."""
    torch.manual_seed(0)
    net, (X, y) = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 64)), regression()
    opt, scaler = torch.optim.SGD(net.parameters(), lr=1e-3), torch.amp.GradScaler("cpu")
    for _ in range(2):
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                value = F.mse_loss(net(X[i:i + BATCH]).float(), y[i:i + BATCH])
            scaler.scale(value).backward()
            scaler.step(opt)
            scaler.update()
    return net, scaler.get_scale()


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_an_element_wise_mean_is_scaled_as_the_grad_scaler_scales_it_on_any_devices(devices):
    """The factor counts the target's elements per sample: scaled by the samples alone, the
    gradients were 64 times GradScaler's, and 2-3 devices overflowed every step of the run."""
    ref, last = plain_mse()
    assert last == 65536.0 / 4                   # the plain loop skipped two steps
    torch.manual_seed(0)
    net, scales = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 64)), LastScale()
    dptrain.fit(net, regression(), loss=nn.MSELoss(), optimizer="sgd", lr=1e-3, amp="fp16", shuffle=False,
                epochs=2, batch_size=BATCH, devices=devices, log=None, callbacks=[scales])
    assert scales.scale == last and largest_difference(net, ref) < 1e-5


@pytest.mark.parametrize("kvstore", ["device", "local"])
def test_an_overflow_on_several_devices_skips_the_update_and_halves_the_scale(kvstore):
    net, scales = model(), LastScale()
    before = [p.detach().clone() for p in net.parameters()]
    result = fit(net, 1e4, 2, epochs=1, callbacks=[scales], kvstore=kvstore)
    assert scales.scale < 65536.0 and math.isfinite(result["history"][0]["train_loss"])
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(net.parameters(), before))


def test_a_resumed_fp16_run_goes_on_with_its_scale(tmp_path):
    net = model()
    fit(net, 1e3, 1, epochs=1, checkpoint_dir=str(tmp_path))
    resumed, scales = model(), LastScale()
    fit(resumed, 1e3, 1, epochs=2, checkpoint_dir=str(tmp_path), resume=True, callbacks=[scales])
    ref, _, last = plain(1e3)
    assert largest_difference(resumed, ref) == 0.0 and scales.scale == last


def test_the_scale_halves_on_an_overflow_and_doubles_after_interval_good_steps():
    scale = LossScale(init=8.0, interval=3)
    scale.update(False)
    assert scale.scale == 4.0
    for _ in range(2):
        scale.update(True)
    assert scale.scale == 4.0
    scale.update(True)
    assert scale.scale == 8.0 and scale.good == 0
    assert scale.factor(4) == 2.0 and scale.factor(0) == 8.0
    assert scale.scaled_denominator(None, 2.0) == 2.0 and scale.scaled_denominator(3, 2.0) == 6.0
    assert scale.scaled_denominator(lambda: torch.tensor(3.0), 2.0)() == 6.0
    again = LossScale()
    again.load_state_dict(scale.state_dict())
    assert (again.scale, again.good) == (8.0, 0)


def plain_clipped_accumulated(max_norm, accumulate=2):
    """torch's AMP recipe with clipping (``scaler.unscale_`` first) and accumulation."""
    net, (X, y) = model(), data(1.0)
    opt, scaler = torch.optim.SGD(net.parameters(), lr=100.0), torch.amp.GradScaler("cpu")
    starts = list(range(0, len(X), BATCH))
    for _ in range(2):
        for k in range(0, len(starts), accumulate):
            opt.zero_grad()
            for i in starts[k:k + accumulate]:
                with torch.autocast("cpu", dtype=torch.float16):
                    value = tiny(net(X[i:i + BATCH]).float(), y[i:i + BATCH]) / accumulate
                scaler.scale(value).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)
            scaler.step(opt)
            scaler.update()
    return net


@pytest.mark.parametrize("devices", [1, 2])
def test_fp16_with_clipping_and_accumulation_is_the_grad_scaler_recipe(devices):
    ref = plain_clipped_accumulated(2e-6)
    assert largest_difference(ref, plain_clipped_accumulated(1.0)) > 1e-4          # the clip bites
    net = model()
    fit(net, 1.0, devices, loss=tiny, lr=100.0, clip_grad_norm=2e-6, accumulate_grad_batches=2)
    assert largest_difference(net, ref) < 5e-6
