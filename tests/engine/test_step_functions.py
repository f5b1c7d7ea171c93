"""A step function's loss read in each form it may return, and its denominator known from
the batch once the function has run (per function: several optimizers' steps differ)."""
import contextlib
import re

import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.step_functions import StepFunctions
from tests.distributed.helpers import run_workers

NONE = contextlib.nullcontext()
NET = nn.Linear(3, 1)
BATCH = (torch.randn(5, 3), torch.randn(5, 1))


def mean_step(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1])


def pair_step(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1], reduction="sum"), 10


def test_a_mean_is_read_with_the_samples_as_its_count_and_then_known_from_the_batch():
    steps = StepFunctions(mean_step, None)
    assert steps.known_count(BATCH) == (False, None)        # not run yet: its form is unknown
    value, count, output, mean = steps.loss(NET, BATCH, NONE)
    assert count == 5 and mean and output is None
    summed, count, _ = steps.sum_loss(NET, BATCH, NONE)
    torch.testing.assert_close(summed, value * 5)
    assert steps.known_count(BATCH) == (True, 5)


def test_sum_and_pair_forms_and_each_function_remembered_apart():
    steps = StepFunctions(None, None)          # several: each call names its step
    _, count, _, mean = steps.loss(NET, BATCH, NONE, pair_step)
    assert (count, mean) == (10, False)
    assert steps.known_count(BATCH, pair_step) == (False, None)     # counted by the step itself
    assert steps.known_count(BATCH, mean_step) == (False, None)     # never run
    steps.loss(NET, BATCH, NONE, mean_step)
    assert steps.known_count(BATCH, mean_step) == (True, 5)
    summing = StepFunctions(mean_step, "sum")
    summing.loss(NET, BATCH, NONE)
    assert summing.known_count(BATCH) == (True, None)          # a sum: nothing to divide by here


@pytest.mark.parametrize("returned, said", [((1.0, 2.0, 3.0), "step returned 3 values"),
                                            (torch.ones(2), "step must return the loss (one number)")])
def test_other_returns_are_refused_naming_the_forms(returned, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        StepFunctions(lambda net, batch: returned, None).loss(NET, BATCH, NONE)


class AutoEncoder(nn.Module):
    """PyTorch's VAE example (its noise drawn where ``noisy``): the loss summed over the batch."""

    def __init__(self, noisy=True):
        super().__init__()
        self.noisy = noisy
        self.encode, self.mu, self.logvar, self.decode = nn.Linear(20, 8), nn.Linear(8, 2), nn.Linear(8, 2), \
            nn.Linear(2, 20)

    def forward(self, x):
        h = torch.relu(self.encode(x))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training and self.noisy else mu
        return torch.sigmoid(self.decode(z)), mu, logvar


def vae_step(model, batch):
    x, _ = batch
    recon, mu, logvar = model(x)
    bce = nn.functional.binary_cross_entropy(recon, x, reduction="sum")
    return bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


def vae_mean_step(model, batch):
    return vae_step(model, batch) / len(batch[0])


def made(noisy=True):
    torch.manual_seed(0)
    return AutoEncoder(noisy).double()


def vae_data():
    g = torch.Generator().manual_seed(0)
    return torch.rand(64, 20, generator=g, dtype=torch.float64), torch.zeros(64)


def vae_fit(devices, step, noisy=True, **kw):
    model = made(noisy)
    result = dptrain.fit(model, vae_data(), step=step, epochs=1, batch_size=16, devices=devices, lr=1e-3,
                         optimizer=torch.optim.SGD, shuffle=False, log=None, progress=False, **kw)
    return model, result


def test_a_step_returning_a_sum_on_several_devices_is_an_error_naming_reduction_sum():
    """Taken as a mean, each device's sum counted as its mean: 2 devices trained at half the
    gradient, 3 at a third, and train_loss was 231, 116, 78 (the noise of the VAE's sampling too:
    the check runs in eval mode)."""
    with pytest.raises(ValueError, match=r"step=vae_step returns a sum over the samples \(its value on a batch, .* is "
                                         r"the sum of its values on the two halves.*cut into 2 parts.*Pass "
                                         r"reduction='sum' to fit"):
        vae_fit(2, vae_step)


def plain_vae(step):
    model = made(noisy=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = vae_data()
    for i in range(0, 64, 16):
        optimizer.zero_grad()
        step(model, (x[i:i + 16], y[i:i + 16])).backward()
        optimizer.step()
    return model


@pytest.mark.parametrize("devices", [1, 3])
def test_a_sum_declared_or_a_mean_trains_as_the_plain_loop_and_one_device_is_not_asked(devices):
    for step, kw in ((vae_step, {"reduction": "sum"}), (vae_mean_step, {})):
        model, _ = vae_fit(devices, step, noisy=False, **kw)
        for p, q in zip(model.parameters(), plain_vae(step).parameters()):
            torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)
    model, result = vae_fit(1, vae_step)      # one device: the sum as the plain loop takes it, no question
    assert result["history"][-1]["train_loss"] > 100


def two_processes(rank, world):
    try:
        vae_fit(1, vae_step)
    except ValueError as e:
        return str(e)
    return None


def test_two_processes_each_say_the_sum_before_any_exchange():
    for said in run_workers(two_processes):
        assert said is not None and "step=vae_step returns a sum" in said and "cut into 2 parts" in said
