"""A LightningModule with automatic_optimization off (its training_step steps its optimizers)
trains as the plain loop on the whole batch, on 1-3 devices and 2 processes (manual_optimization.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.distributed.helpers import run_workers
from tests.engine.test_lightning_module import LightningLike


class GAN(nn.Module):
    """Lightning's GAN recipe: two optimizers stepped in training_step, each toggled, the
    discriminator's gradient clipped, its scheduler stepped every batch, both losses logged."""

    def __init__(self, extra_step=False, returns=False, noise=False):
        super().__init__()
        self.automatic_optimization = False
        self.extra_step, self.returns, self.noise = extra_step, returns, noise
        torch.manual_seed(0)
        self.g = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)).double()
        self.d = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).double()

    def training_step(self, batch, batch_idx):
        x, real = batch
        if self.noise:
            x = x + 0.1 * torch.randn_like(x)
        opt_g, opt_d = self.optimizers()
        self.toggle_optimizer(opt_g)
        g_loss = bce(self.d(self.g(x)), 1.0)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        with self.toggled_optimizer(opt_d):
            d_loss = bce(self.d(real), 1.0) + bce(self.d(self.g(x).detach()), 0.0)
            self.manual_backward(d_loss)
            self.clip_gradients(opt_d, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt_d.step()
            opt_d.zero_grad()
        if self.extra_step and len(x) > 16:         # (a step on a condition only some devices meet)
            opt_g.step()
        self.lr_schedulers().step()
        self.log("g_loss", g_loss)
        self.log("d_loss", d_loss)
        return d_loss if self.returns else None

    def configure_optimizers(self):
        og = torch.optim.Adam(self.g.parameters(), lr=1e-2)
        od = torch.optim.SGD(self.d.parameters(), lr=0.1, momentum=0.9)
        return [og, od], [torch.optim.lr_scheduler.StepLR(od, 1, 0.9)]


def bce(logits, label):
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, label))


def data(n=96):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64) + 2


def plain(model, X, R, batch=32, epochs=2):
    """The plain loop of the same program on one device: each optimizer stepped on the batch's mean."""
    og = torch.optim.Adam(model.g.parameters(), lr=1e-2)
    od = torch.optim.SGD(model.d.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(od, 1, 0.9)
    for _ in range(epochs):
        for s in range(0, len(X), batch):
            x, real = X[s:s + batch], R[s:s + batch]
            model.d.requires_grad_(False)
            bce(model.d(model.g(x)), 1.0).backward()
            og.step()
            og.zero_grad()
            model.d.requires_grad_(True)
            model.g.requires_grad_(False)
            (bce(model.d(real), 1.0) + bce(model.d(model.g(x).detach()), 0.0)).backward()
            torch.nn.utils.clip_grad_norm_(list(model.d.parameters()), 0.5)
            od.step()
            od.zero_grad()
            model.g.requires_grad_(True)
            scheduler.step()
    return model


def fitted(model, devices, n=96, **kw):
    result = dptrain.fit(model, data(n), epochs=kw.pop("epochs", 2), batch_size=32, devices=devices, shuffle=False,
                         log=None, progress=False, **kw)
    return model, result


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_two_optimizers_stepped_in_training_step_train_as_the_plain_loop(devices):
    reference = plain(GAN(), *data())
    model, result = fitted(GAN(), devices)
    if devices == 1:                # nothing to sum: the plain loop's calls
        assert torch.equal(flat(model), flat(reference))
    torch.testing.assert_close(flat(model), flat(reference), rtol=1e-10, atol=1e-10)
    row = result["history"][-1]
    assert row["lr_1"] == pytest.approx(0.1 * 0.9 ** 6) and row["lr_0"] == 1e-2     # the module's own steps
    assert set(row) >= {"train_g_loss", "train_d_loss"} and row["train_loss"] != row["train_loss"]     # (none returned)


def test_a_device_without_a_sample_follows_the_others_steps():
    reference = plain(GAN(), *data(98))          # a last batch of 2 samples on 3 devices
    model, _ = fitted(GAN(), 3, n=98)
    torch.testing.assert_close(flat(model), flat(reference), rtol=1e-10, atol=1e-10)


def _two_processes(rank, world):
    model, result = fitted(GAN(returns=True), 2, n=97)
    return flat(model).tolist(), [row["train_loss"] for row in result["history"]]


def test_two_processes_of_two_devices_train_as_the_plain_loop():
    """97 samples: the last batch's one sample leaves the second process none (its devices follow)."""
    (first, losses), (second, _) = run_workers(_two_processes)
    assert first == second
    torch.testing.assert_close(torch.tensor(first, dtype=torch.float64), flat(plain(GAN(), *data(97))),
                               rtol=1e-10, atol=1e-10)
    _, one = fitted(GAN(returns=True), 1, n=97)
    assert losses == pytest.approx([row["train_loss"] for row in one["history"]], rel=1e-10)


def test_steps_that_differ_between_devices_are_an_error_naming_them():
    with pytest.raises(ValueError, match=r"training_step stepped its optimizers differently on the devices and "
                                         r"processes: device 0 called optimizer 0's step\(\), device 1 stepped optimizer 1's "
                                         r"scheduler"):
        dptrain.fit(GAN(extra_step=True), data(66), epochs=1, batch_size=33, devices=2, log=None, progress=False)


@pytest.mark.parametrize("setting, said", [({"accumulate_grad_batches": 2}, "accumulate_grad_batches > 1"),
                                           ({"clip_grad_norm": 1.0}, r"clip_grad_norm or clip_grad_value \(clip in "
                                                                     r"training_step: self.clip_gradients")])
def test_what_manual_optimization_cannot_keep_is_refused(setting, said):
    with pytest.raises(ValueError, match=f"the module turns Lightning's automatic_optimization off .* does not go "
                                         f"with {said}"):
        dptrain.fit(GAN(), data(), epochs=1, batch_size=32, devices=2, log=None, progress=False, **setting)


def test_a_resumed_run_ends_as_the_unbroken_one(tmp_path):
    unbroken, _ = fitted(GAN(), 2, epochs=3)
    fitted(GAN(), 2, epochs=2, checkpoint_dir=str(tmp_path))
    resumed, _ = fitted(GAN(), 2, epochs=3, checkpoint_dir=str(tmp_path), resume=True)
    assert torch.equal(flat(unbroken), flat(resumed))


def test_noise_drawn_on_cpu_devices_repeats_run_to_run_and_the_returned_loss_is_the_figure():
    first, result = fitted(GAN(noise=True, returns=True), 2)
    second, _ = fitted(GAN(noise=True, returns=True), 2)
    assert torch.equal(flat(first), flat(second))          # (the copies drew in turn, in device order)
    rows = result["history"]
    assert rows[-1]["train_loss"] == pytest.approx(rows[-1]["train_d_loss"], rel=1e-9)


def test_an_evaluation_steps_nothing_and_evaluate_needs_a_validation_step():
    trained, _ = fitted(GAN(returns=True), 2)
    evaluated, result = fitted(GAN(returns=True), 2, eval_data=data(64))
    assert torch.equal(flat(trained), flat(evaluated))      # (training_step's loss, called without its steps)
    assert all(row["test_loss"] == row["test_loss"] for row in result["history"])
    with pytest.raises(ValueError, match="automatic_optimization off .* and has no test_step or validation_step to "
                                         "evaluate it: give it one"):
        dptrain.evaluate(GAN(), data(), devices=2)


class Accumulating(LightningLike):
    """Lightning's manual accumulation (a step every second batch) and an epoch's scheduler
    stepped in on_train_epoch_end, as Lightning's lr_schedulers() reads the trainer there."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)).double()

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = F.mse_loss(self.net(batch[0]), batch[1])
        self.manual_backward(loss)
        if (batch_idx + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
        return loss

    def on_train_epoch_end(self):
        self.trainer.lr_scheduler_configs[0].scheduler.step()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}


@pytest.mark.parametrize("devices", [1, 3])
def test_steps_every_second_batch_and_an_epoch_end_scheduler_train_as_the_plain_loop(devices):
    X, Y = data(128)
    reference = Accumulating()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    for _ in range(3):
        for b, s in enumerate(range(0, 128, 32)):
            F.mse_loss(reference.net(X[s:s + 32]), Y[s:s + 32]).backward()
            if (b + 1) % 2 == 0:
                opt.step()
                opt.zero_grad()
        scheduler.step()
    model = Accumulating()
    result = dptrain.fit(model, (X, Y), epochs=3, batch_size=32, devices=devices, shuffle=False, log=None,
                         progress=False)
    torch.testing.assert_close(flat(model), flat(reference), rtol=1e-12, atol=1e-12)
    assert result["history"][-1]["lr_0"] == pytest.approx(0.1 * 0.5 ** 2)      # (the rate epoch 3 trained at)


class Failing(GAN):
    def training_step(self, batch, batch_idx):
        if len(batch[0]) == 16:         # (device 1's part of 33 samples)
            raise RuntimeError("the second part fails")
        return super().training_step(batch, batch_idx)


def test_a_device_failing_mid_step_raises_its_error_and_the_others_do_not_wait():
    with pytest.raises(RuntimeError, match="the second part fails"):
        dptrain.fit(Failing(), data(66), epochs=1, batch_size=33, devices=2, log=None, progress=False)


class Penalized(GAN):
    """A WGAN-GP's critic steps: a gradient penalty taken with torch.autograd.grad in the step
    (the trial before training and an evaluation call it too: with gradients, its steps idle)."""

    def training_step(self, batch, batch_idx):
        x, real = batch
        opt_g, opt_d = self.optimizers()
        for _ in range(2):
            fake = self.g(x).detach()
            eps = torch.sigmoid(x[:, :1])
            mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
            grad, = torch.autograd.grad(self.d(mix).sum(), mix, create_graph=True)
            d_loss = self.d(fake).mean() - self.d(real).mean() + 10 * ((grad.norm(dim=1) - 1) ** 2).mean()
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
        opt_g.zero_grad()
        self.manual_backward(-self.d(self.g(x)).mean())
        opt_g.step()
        return d_loss

    def configure_optimizers(self):
        return [torch.optim.Adam(self.g.parameters(), 1e-3), torch.optim.Adam(self.d.parameters(), 1e-3)]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_gradient_penalty_taken_in_the_step_trains_as_the_plain_loop(devices):
    X, R = data()
    reference = Penalized()
    opt_g, opt_d = reference.configure_optimizers()
    for _ in range(2):
        for s in range(0, 96, 32):
            x, real = X[s:s + 32], R[s:s + 32]
            for _ in range(2):
                fake = reference.g(x).detach()
                eps = torch.sigmoid(x[:, :1])
                mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
                grad, = torch.autograd.grad(reference.d(mix).sum(), mix, create_graph=True)
                opt_d.zero_grad()
                (reference.d(fake).mean() - reference.d(real).mean() + 10 * ((grad.norm(dim=1) - 1) ** 2).mean()
                 ).backward()
                opt_d.step()
            opt_g.zero_grad()
            (-reference.d(reference.g(x)).mean()).backward()
            opt_g.step()
    model, result = fitted(Penalized(), devices, eval_data=data(32))
    torch.testing.assert_close(flat(model), flat(reference), rtol=1e-10, atol=1e-10)
    assert result["history"][-1]["test_loss"] == result["history"][-1]["test_loss"]       # (evaluated)


class Counting(GAN, LightningLike):             # (Lightning's global_step reads its trainer)
    def training_step(self, batch, batch_idx):
        if self.training:
            self.seen.append(self.global_step)
        return super().training_step(batch, batch_idx)


def counting():
    model = Counting()
    model.seen = []
    return model


def test_global_step_counts_every_optimizers_steps_as_lightnings_and_resumes(tmp_path):
    model, _ = fitted(counting(), 2)
    assert model.seen == [0, 2, 4, 6, 8, 10]            # two optimizers, 3 batches an epoch
    fitted(counting(), 2, epochs=1, checkpoint_dir=str(tmp_path))
    resumed, _ = fitted(counting(), 2, epochs=2, checkpoint_dir=str(tmp_path), resume=True)
    assert resumed.seen == [6, 8, 10]


def test_the_epoch_line_leaves_out_a_train_loss_the_step_does_not_return():
    lines = []
    dptrain.fit(GAN(), data(), epochs=1, batch_size=32, devices=1, log=lines.append, progress=False)
    epoch = next(line for line in lines if line.startswith("epoch 1"))
    assert "train loss" not in epoch.replace("train g loss", "").replace("train d loss", "") and "train d loss" in epoch


@pytest.mark.parametrize("n", [96, 97])
def test_copies_running_at_once_as_on_gpus_train_as_the_plain_loop(monkeypatch, n):
    """Without turns (GPUs' way), the copies meet only in the rounds: the same updates (a model
    drawing nothing), a sampleless device following too."""
    from dptrain.engine import manual_optimization
    monkeypatch.setattr(manual_optimization, "IN_TURN", ())
    reference = plain(GAN(), *data(n))
    model, _ = fitted(GAN(), 3, n=n)
    torch.testing.assert_close(flat(model), flat(reference), rtol=1e-10, atol=1e-10)


class LeavesAToggle(GAN):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.toggle_optimizer(self.optimizers()[0])         # (never untoggled)
        return out


@pytest.mark.parametrize("devices", [1, 2])
def test_a_toggle_the_step_leaves_on_is_undone_after_it(devices):
    model, _ = fitted(LeavesAToggle(), devices)
    assert all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(flat(model), flat(plain(GAN(), *data())), rtol=1e-10, atol=1e-10)
