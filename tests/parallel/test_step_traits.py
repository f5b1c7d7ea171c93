"""What an optimizer's step needs, asked once: a closure (LBFGS, SAM), or every parameter at
once (a step size over the whole group); and what a Trainer does with the answer."""
import functools

import pytest
import torch

import dptrain
from dptrain.parallel.optim import OptimizerPlan
from dptrain.parallel.step_traits import StepTraits, step_traits
from tests.engine.test_closure_step import SAM
from tests.parallel.optimizer_shapes import GroupStepSize, TimmShape


class CountsCalls(torch.optim.Optimizer):
    """A first-order optimizer of the user's that counts its steps in an attribute."""
    calls = 0

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        type(self).calls += 1
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])


def traits(make):
    params = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2, 2))]
    return step_traits(OptimizerPlan.from_optimizer(make(params), params), len(params))


@pytest.mark.parametrize("make, expected", [
    (functools.partial(torch.optim.Adam, lr=0.1), StepTraits()),
    (functools.partial(torch.optim.LBFGS, lr=1), StepTraits(closure="evaluates")),
    (lambda ps: SAM(ps, torch.optim.SGD, lr=0.1), StepTraits(closure="after_backward")),
    (GroupStepSize, StepTraits(changes_groups=True)),
    (lambda ps: TimmShape(torch.optim.AdamW(ps)), StepTraits(changes_groups=True)),
    (CountsCalls, StepTraits()),
])
def test_each_kind_of_optimizer_is_told_apart(make, expected):
    assert traits(make) == expected
    assert traits(make).whole == (expected != StepTraits())


def test_the_question_is_one_step_on_stand_ins_never_on_the_model():
    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    CountsCalls.calls = 0
    dptrain.Trainer(dptrain.replicate(model, ["cpu:0", "cpu:1"]), CountsCalls(model.parameters()))
    assert CountsCalls.calls == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


@pytest.mark.parametrize("make, kvstore", [(GroupStepSize, "local"), (functools.partial(torch.optim.Adam, lr=0.1),
                                                                       "device")])
def test_one_that_needs_every_parameter_makes_the_trainer_update_all_on_every_device(make, kvstore):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    trainer = dptrain.Trainer(dptrain.replicate(model, ["cpu:0", "cpu:1"]), make(model.parameters()), kvstore="device")
    assert trainer.kvstore.name == kvstore
