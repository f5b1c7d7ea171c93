"""A LightningModule's own configure_gradient_clipping decides each update's clipping, as
Lightning's Trainer calls it (lightning_clipping.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.lightning_clipping import reaches_for_gradients
from tests.engine.test_lightning_module import LightningLike


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(128, 6, generator=g, dtype=torch.float64) * 3
    return X, (X[:, 0] > 0).long()


class Clipped(LightningLike):
    """Lightning's documented hook: clipping turned on from an epoch (``hook``: another body)."""

    def __init__(self, hook=None, **clip):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)).double()
        self.hook, self.clip, self.calls = hook, clip or {"gradient_clip_val": 0.05}, []

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
        self.calls.append((self.current_epoch, self.global_step, gradient_clip_val, gradient_clip_algorithm,
                           self.trainer.gradient_clip_val, optimizer.param_groups[0]["lr"]))
        if self.hook is not None:
            return self.hook(self, optimizer, gradient_clip_val, gradient_clip_algorithm)
        if self.current_epoch >= 1:
            self.clip_gradients(optimizer, **self.clip)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def plain(accumulate=1, clip_from=1, max_norm=0.05):
    """The same updates in a plain loop, clipping from epoch ``clip_from``: the weights and each
    update's norm before clipping."""
    model, (X, y) = Clipped(), data()
    opt = model.configure_optimizers()
    norms = []
    for epoch in range(2):
        for b in range(8):
            (F.cross_entropy(model.net(X[b * 16:(b + 1) * 16]), y[b * 16:(b + 1) * 16]) / accumulate).backward()
            if (b + 1) % accumulate:
                continue
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                                max_norm if epoch >= clip_from else float("inf"))))
            opt.step()
            opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), norms


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("devices, accumulate", [(1, 1), (2, 1), (2, 2)])
def test_the_hooks_clipping_from_an_epoch_trains_as_a_plain_loop_clipping_there(devices, accumulate):
    want, norms = plain(accumulate)
    unclipped, _ = plain(accumulate, clip_from=2)
    assert max(norms[len(norms) // 2:]) > 0.05 and not torch.allclose(want, unclipped)   # (the clipping counts)
    model = Clipped()
    result = dptrain.fit(model, data(), epochs=2, batch_size=16, devices=devices, shuffle=False, log=None,
                         progress=False, accumulate_grad_batches=accumulate, log_every_n_steps=1, log_grad_norm=True)
    updates = 8 // accumulate
    assert [c[:5] for c in model.calls] == [(e, e * updates + s, None, None, None)
                                            for e in range(2) for s in range(updates)]
    assert model.calls[0][5] == 0.1         # (the run's optimizer)
    torch.testing.assert_close(weights(model), want, rtol=1e-10, atol=1e-10)
    # each update's norm before clipping is logged, clipped or not (log_grad_norm)
    assert [r["grad_norm"] for r in result["step_history"]] == pytest.approx(norms, rel=1e-8)


def test_lightnings_own_body_passes_fits_clipping_through():
    """Lightning's default hook, written out: fit's clip_grad_value= reaches it as the Trainer's."""
    def default(self, optimizer, val, algorithm):
        self.clip_gradients(optimizer, gradient_clip_val=val, gradient_clip_algorithm=algorithm)
    model = Clipped(default)

    class NoHook(LightningLike):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)).double()
        training_step, configure_optimizers = Clipped.training_step, Clipped.configure_optimizers
    reference = NoHook()
    for m in (model, reference):
        dptrain.fit(m, data(), epochs=1, batch_size=16, devices=2, shuffle=False, log=None, progress=False,
                    clip_grad_value=0.01)
    assert model.calls[0][2:5] == (0.01, "value", 0.01)
    assert torch.equal(weights(model), weights(reference))
    unclipped = NoHook()
    dptrain.fit(unclipped, data(), epochs=1, batch_size=16, devices=2, shuffle=False, log=None, progress=False)
    assert not torch.allclose(weights(unclipped), weights(reference))


def test_a_norm_then_a_value_both_clip_and_zero_clips_nothing():
    def both(self, optimizer, val, algorithm):
        self.clip_gradients(optimizer, 0.0)                     # (Lightning's: nothing)
        self.clip_gradients(optimizer, 0.5, "norm")
        self.clip_gradients(optimizer, 0.01, "VALUE")
    model = Clipped(both)
    dptrain.fit(model, data(), epochs=1, batch_size=16, devices=2, shuffle=False, log=None, progress=False)
    reference = Clipped()
    X, y = data()
    opt = reference.configure_optimizers()
    for b in range(8):
        F.cross_entropy(reference.net(X[b * 16:(b + 1) * 16]), y[b * 16:(b + 1) * 16]).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        torch.nn.utils.clip_grad_value_(reference.parameters(), 0.01)
        opt.step()
        opt.zero_grad()
    torch.testing.assert_close(weights(model), weights(reference), rtol=1e-10, atol=1e-10)


def _clips_p_grad(self, optimizer, val, algorithm):
    torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)


def _reads_p_grad(self, optimizer, val, algorithm):
    for p in self.parameters():
        if p.grad is not None:
            p.grad.clamp_(-1, 1)


@pytest.mark.parametrize("body, fit_clip, said", [
    (_clips_p_grad, {}, "the module's configure_gradient_clipping reads or clips p.grad itself"),
    (_reads_p_grad, {}, r"call self.clip_gradients\(optimizer, gradient_clip_val=..."),
    (lambda self, opt, v, a: self.clip_gradients(opt, 0.5), {"clip_grad_norm": 1.0}, "give only one"),
    (lambda self, opt, v, a: self.clip_gradients(opt, 1.0, "value"), {"clip_grad_norm": 1.0},
     "fit clips by norm and the module's configure_gradient_clipping asks"),
    (lambda self, opt, v, a: self.clip_gradients(opt, 0.5, "l2"), {}, "give 'norm' or 'value'"),
    (lambda self, opt, v, a: (self.clip_gradients(opt, 0.5, "value"), self.clip_gradients(opt, 0.5)), {},
     "clips by value and then by norm"),
    (lambda self, opt, v, a: None, {"clip_grad_norm": 1.0, "clip_grad_value": 1.0}, "give fit one, or neither"),
])
def test_a_hook_fit_cannot_keep_is_an_error_naming_the_fix(body, fit_clip, said):
    class Own(Clipped):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
            body(self, optimizer, gradient_clip_val, gradient_clip_algorithm)
    if body in (_clips_p_grad, _reads_p_grad):      # (its code, not the wrapper's: the check reads the source)
        Own.configure_gradient_clipping = body
    with pytest.raises(ValueError, match=said):
        dptrain.fit(Own(), data(), epochs=1, batch_size=16, devices=1, log=None, progress=False, **fit_clip)


def test_the_source_check_reads_code_not_comments_or_strings():
    def asks(self, optimizer, val, algorithm):
        # not p.grad: clip_grad_norm_ would clip nothing here
        self.clip_gradients(optimizer, 0.5, "norm")     # "p.grad"
        return self.gradient_scale, optimizer.grad_free
    assert not reaches_for_gradients(asks)
    assert reaches_for_gradients(_clips_p_grad) and reaches_for_gradients(_reads_p_grad)
    assert not reaches_for_gradients(len)                       # (no source: nothing to read)


def test_with_manual_optimization_the_hook_is_not_called_and_said_so():
    """(Lightning's Trainer calls it in automatic optimization only; clip in training_step there.)"""
    from tests.engine.test_manual_optimization import GAN, data as gan_data

    class ClipsToo(GAN):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
            raise AssertionError("not called with manual optimization")
    lines = []
    dptrain.fit(ClipsToo(), gan_data(), epochs=1, batch_size=32, devices=1, log=lines.append, progress=False)
    assert any("the module's configure_gradient_clipping is not called (Lightning's Trainer does not call it with "
               "automatic_optimization off)" in line for line in lines)
