"""A scheduler built on the optimizer given to ``fit`` (Accelerate's and Lightning's habit): lent
to the optimizer that trains, stepped as the plain loop steps it, and given back, with no warning
from torch; one built on another optimizer, or with ``lr=``, is an error naming the fix."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def warm_up(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))


@pytest.mark.parametrize("devices", [1, 2])
def test_a_scheduler_built_on_the_users_optimizer_steps_as_in_the_plain_loop_over_two_fits(devices):
    X, y = data()
    model, plain = net(), net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = warm_up(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)        # torch's "optimizer.step() has been overridden"
        for _ in range(2):
            dptrain.fit(model, (X, y), epochs=1, batch_size=16, shuffle=False, devices=devices, log=None,
                        optimizer=optimizer, scheduler=scheduler,
                        scheduler_interval="batch" if devices == 1 else "step")    # (Lightning's name)
    theirs = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    their_scheduler = warm_up(theirs)
    for _ in range(2):
        for i in range(0, len(X), 16):
            theirs.zero_grad()
            F.cross_entropy(plain(X[i:i + 16]), y[i:i + 16]).backward()
            theirs.step()
            their_scheduler.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert scheduler.optimizer is optimizer and scheduler.last_epoch == their_scheduler.last_epoch == 8
    assert optimizer.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"])    # 0.9 of 0.1: mid warm-up


def test_a_scheduler_built_on_another_optimizer_or_with_lr_is_refused():
    X, y = data()
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="built on the optimizer given to fit.*LambdaLR"):
        dptrain.fit(model, (X, y), epochs=1, log=None, optimizer=torch.optim.SGD,
                    scheduler=warm_up(torch.optim.SGD(model.parameters(), lr=0.1)))
    with pytest.raises(ValueError, match="lr= with a scheduler built on the optimizer"):
        dptrain.fit(model, (X, y), epochs=1, log=None, optimizer=optimizer, scheduler=warm_up(optimizer), lr=0.5)
