"""A LightningModule's own optimizer_step (Lightning's documented warm-up) makes each update, and its own
lr_scheduler_step (a timm scheduler's) steps its schedulers, as
Lightning's Trainer calls it (lightning_optimizer_step.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(128, 6, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long()


class WarmUp(LightningLike):
    """The warm-up of Lightning's docs: the rate of the update after global_step's."""

    def __init__(self, hook=None):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)).double()
        self.hook, self.calls = hook, []

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        if self.hook is not None:
            return self.hook(optimizer, optimizer_closure)
        optimizer.step(closure=optimizer_closure)
        self.calls.append((epoch, batch_idx, self.trainer.global_step, optimizer.param_groups[0]["lr"]))
        if self.trainer.global_step < 6:
            for group in optimizer.param_groups:
                group["lr"] = min(1.0, (self.trainer.global_step + 1) / 6) * 0.1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def plain(accumulate):
    """The same updates in a plain loop: every `accumulate` batches of 16, the rate set after."""
    model, (X, y) = WarmUp(), data()
    opt = model.configure_optimizers()
    calls, step = [], 0
    for epoch in range(2):
        for b in range(8):
            (F.cross_entropy(model.net(X[b * 16:(b + 1) * 16]), y[b * 16:(b + 1) * 16]) / accumulate).backward()
            if (b + 1) % accumulate:
                continue
            opt.step()
            opt.zero_grad()
            calls.append((epoch, b, step, opt.param_groups[0]["lr"]))
            if step < 6:
                for group in opt.param_groups:
                    group["lr"] = min(1.0, (step + 1) / 6) * 0.1
            step += 1
    return model, calls


@pytest.mark.parametrize("devices, accumulate", [(1, 1), (2, 1), (2, 2)])
def test_a_warm_up_in_optimizer_step_trains_as_lightnings_trainer_calls_it(devices, accumulate):
    reference, calls = plain(accumulate)
    model = WarmUp()
    dptrain.fit(model, data(), epochs=2, batch_size=16, devices=devices, shuffle=False, log=None, progress=False,
                accumulate_grad_batches=accumulate)
    assert [c[:3] for c in model.calls] == [c[:3] for c in calls]      # epoch, batch_idx, global_step
    assert [c[3] for c in model.calls] == pytest.approx([c[3] for c in calls])
    flat = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in (model, reference)]
    if devices == 1 and accumulate == 1:
        assert torch.equal(*flat)
    torch.testing.assert_close(*flat, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("hook, said", [
    (lambda opt, closure: None, "returned without optimizer.step"),
    (lambda opt, closure: closure(), "optimizer_closure is dptrain's step"),
    (lambda opt, closure: (opt.step(closure=closure), opt.step(closure=closure)), "twice in one optimizer_step"),
    (lambda opt, closure: opt.step(), "without the optimizer_closure it was given")])
def test_a_hook_that_does_not_make_the_update_once_is_an_error_naming_the_fix(hook, said):
    with pytest.raises(ValueError, match=said):
        dptrain.fit(WarmUp(hook), data(), epochs=1, batch_size=16, devices=1, log=None, progress=False)


class Halving:
    """A scheduler of timm's shape (not torch's): ``step(epoch)`` sets each group's rate."""

    def __init__(self, optimizer):
        self.optimizer, self.base = optimizer, [g["lr"] for g in optimizer.param_groups]

    def step(self, epoch, metric=None):
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * 0.5 ** epoch

    def step_update(self, num_updates, metric=None):
        raise AssertionError("the module's lr_scheduler_step decides how it steps")

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class OwnSchedulerStep(LightningLike):
    """Lightning's way to step a timm scheduler: the module's lr_scheduler_step."""

    def __init__(self, interval):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)).double()
        self.interval, self.calls = interval, []

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def lr_scheduler_step(self, scheduler, metric):
        self.calls.append((self.current_epoch, self.global_step, metric))
        scheduler.step(epoch=self.current_epoch + 1 if self.interval == "epoch" else self.global_step // 4)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": Halving(opt), "interval": self.interval}}


@pytest.mark.parametrize("interval", ["epoch", "step"])
@pytest.mark.parametrize("devices", [1, 2])
def test_the_modules_lr_scheduler_step_steps_its_scheduler_as_lightnings_trainer_calls_it(interval, devices):
    X, y = data()
    reference = OwnSchedulerStep(interval)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    calls, step = [], 0
    for epoch in range(2):
        for b in range(8):
            F.cross_entropy(reference.net(X[b * 16:(b + 1) * 16]), y[b * 16:(b + 1) * 16]).backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if interval == "step":
                calls.append((epoch, step, None))
                opt.param_groups[0]["lr"] = 0.1 * 0.5 ** (step // 4)
        if interval == "epoch":
            calls.append((epoch, step, None))
            opt.param_groups[0]["lr"] = 0.1 * 0.5 ** (epoch + 1)
    model = OwnSchedulerStep(interval)
    dptrain.fit(model, data(), epochs=2, batch_size=16, devices=devices, shuffle=False, log=None, progress=False)
    assert model.calls == calls         # (epoch, global_step as Lightning's after the update, metric)
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                               torch.cat([p.detach().reshape(-1) for p in reference.parameters()]),
                               rtol=1e-10, atol=1e-10)
