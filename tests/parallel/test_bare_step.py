"""bare_step: the optimizer's own update without torch's wrappers, and the wrapped call
whenever a profiler or a hook could tell the difference."""
import functools

import pytest
import torch

from dptrain.parallel import bare_step


def _model_and_grads(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    return net


def _backward(net, seed):
    g = torch.Generator().manual_seed(seed)
    net(torch.randn(8, 5, generator=g)).pow(2).mean().backward()


@pytest.mark.parametrize("make", [
    functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True),
    functools.partial(torch.optim.Adam, lr=0.01),
    functools.partial(torch.optim.AdamW, lr=0.01, foreach=True),
    functools.partial(torch.optim.RMSprop, lr=0.01),
])
def test_same_update_as_the_optimizer_step(make):
    ours, theirs = _model_and_grads(), _model_and_grads()
    opt_ours, opt_theirs = make(ours.parameters()), make(theirs.parameters())
    for k in range(4):
        _backward(ours, k)
        _backward(theirs, k)
        bare_step.step(opt_ours)
        bare_step.zero_grad(opt_ours)
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
        assert a.grad is None
    steps = lambda opt, p: float(opt.state[p].get("step", 0))     # a tensor, or an int (RMSprop, torch 2.3)  # noqa: E731
    assert [steps(opt_ours, a) for a in ours.parameters()] == [steps(opt_theirs, b) for b in theirs.parameters()]


def test_hooks_still_run():
    net = _model_and_grads()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = []
    handle = opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    _backward(net, 0)
    bare_step.step(opt)
    assert seen == ["pre", "post"]
    handle.remove()
    from torch.optim.optimizer import register_optimizer_step_post_hook
    glob = register_optimizer_step_post_hook(lambda o, args, kwargs: seen.append("global"))
    try:
        bare_step.step(opt)
    finally:
        glob.remove()
    assert seen == ["pre", "post", "post", "global"]


def test_a_profiler_sees_the_step_and_zero_grad():
    net = _model_and_grads()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    _backward(net, 0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        bare_step.step(opt)
        bare_step.zero_grad(opt)
    names = {e.name for e in prof.events()}
    assert "Optimizer.step#SGD.step" in names
    assert "Optimizer.zero_grad#SGD.zero_grad" in names


class _Recording(torch.optim.SGD):
    """A user's optimizer: its own zero_grad, and a step with its own decorator marked hooked."""
    grad_modes = []

    @torch.no_grad()
    def step(self, closure=None):
        type(self).grad_modes.append(torch.is_grad_enabled())
        return super().step(closure)
    step.hooked = True      # torch then leaves it unwrapped: its __wrapped__ is the user's

    def zero_grad(self, set_to_none=True):
        type(self).grad_modes.append("zero")
        super().zero_grad(set_to_none)


def test_a_users_own_step_and_zero_grad_are_called_as_written():
    net = _model_and_grads()
    opt = _Recording(net.parameters(), lr=0.1)
    _backward(net, 0)
    bare_step.step(opt)
    bare_step.zero_grad(opt)
    assert _Recording.grad_modes == [False, "zero"]     # under its own no_grad: not unwrapped
    assert all(p.grad is None for p in net.parameters())


def test_an_instance_step_is_called():
    net = _model_and_grads()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    calls = []
    original = opt.step
    opt.step = lambda *a, **k: (calls.append(1), original(*a, **k))[1]      # as old lr schedulers patch it
    _backward(net, 0)
    bare_step.step(opt)
    assert calls == [1]
