"""local_step.py: one device's update is the plain loop's, with clipping, copies and the NaN check."""
import copy
import math

import pytest
import torch
from torch import nn

from dptrain.parallel.local_step import local_step
from dptrain.parallel.optim import OptimizerPlan
from dptrain.parallel.replicated_optimizer import ReplicatedOptimizer
from dptrain.parallel.update_report import UpdateReport


def _setup(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    X, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
    return net, X, y


def _backward(net, X, y, scale=1.0):
    (nn.functional.cross_entropy(net(X), y) * scale).backward()


def _ours(net):
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=0.3, momentum=0.9)
    plan = OptimizerPlan.resolve(optimizer, None, params, params)
    replicated = ReplicatedOptimizer(plan, params, [params])
    return params, optimizer, replicated


@pytest.mark.parametrize("max_norm,max_value", [(None, None), (0.05, None), (0.05, 0.01), (math.inf, None)])
def test_an_update_is_the_plain_loops_with_its_clipping(max_norm, max_value):
    net, X, y = _setup()
    plain = copy.deepcopy(net)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.3, momentum=0.9)
    params, optimizer, replicated = _ours(net)
    report = UpdateReport()
    report.keep_grads, report.norms_by_parameter = True, True
    for _ in range(3):
        _backward(plain, X, y)
        expected_grads = [p.grad.clone() for p in plain.parameters()]
        expected_norm = None
        if max_norm is not None:
            expected_norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), max_norm)
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(plain.parameters(), max_value)
        plain_opt.step(); plain_opt.zero_grad()

        _backward(net, X, y)
        stepped, norm = local_step(params, optimizer, replicated, [0], torch.device("cpu"), report,
                                   max_norm=max_norm, max_value=max_value)
        assert stepped and all(p.grad is None for p in params)
        if max_norm is None:
            assert norm is None
        else:
            torch.testing.assert_close(norm, expected_norm)
            names = [f"p{j}" for j in range(len(params))]
            norms = report.grad_norms(names)
            assert list(norms) == names
            torch.testing.assert_close(torch.tensor([norms[n] for n in names], dtype=torch.float64),
                                       torch.stack([g.norm() for g in expected_grads]).double())
        kept = report.take_grads([f"p{j}" for j in range(len(params))], torch.device("cpu"))
        for g, e in zip(kept.values(), expected_grads):       # before clipping
            torch.testing.assert_close(g, e)
        assert report.take_grads(["x"] * len(params), torch.device("cpu")) == {}      # taken once
    for p, q in zip(net.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)


def test_a_nonfinite_gradient_skips_the_update_and_clears_the_gradients():
    net, X, y = _setup()
    params, optimizer, replicated = _ours(net)
    before = [p.detach().clone() for p in params]
    report = UpdateReport()
    report.keep_grads = True
    _backward(net, X, y)
    params[0].grad[0, 0] = math.nan
    stepped, norm = local_step(params, optimizer, replicated, [0], torch.device("cpu"), report,
                               skip_nonfinite=True, max_norm=1.0)
    assert (stepped, norm) == (False, None)
    assert all(p.grad is None for p in params) and report.holds_grads == 0
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_a_loss_scale_is_divided_out_before_the_update():
    net, X, y = _setup()
    plain = copy.deepcopy(net)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.3, momentum=0.9)
    params, optimizer, replicated = _ours(net)
    _backward(plain, X, y)
    plain_opt.step()
    _backward(net, X, y, scale=1024.0)
    stepped, _ = local_step(params, optimizer, replicated, [0], torch.device("cpu"), UpdateReport(),
                            loss_scale=1024.0)
    assert stepped
    for p, q in zip(net.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
