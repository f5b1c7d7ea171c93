"""An optimizer of the user's own that keeps a constructor argument outside its defaults
trains with the user's value on every device, not the argument's default; one that cannot be
built again as cls(groups, **defaults) is refused with the fix."""
import pytest
import torch
from torch import nn

import dptrain
from tests.parallel.plain_loop import plain_steps


class ScaledSignSGD(torch.optim.Optimizer):
    def __init__(self, params, lr=0.01, scale=1.0, name="plain"):
        self.scale, self.name = scale, name          # kept as attributes, not in defaults
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"] * self.scale)


class Needs(ScaledSignSGD):
    def __init__(self, params, schedule, lr=0.01):     # an argument with no default
        super().__init__(params, lr)
        self.schedule = schedule


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


@pytest.mark.parametrize("devices", ["cpu:0", "cpu:0,cpu:1"])
@pytest.mark.parametrize("given", ["object", "factory"])
def test_an_attribute_set_from_a_constructor_argument_reaches_every_device(devices, given):
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 6, generator=g), torch.randint(0, 2, (64,), generator=g)
    model, plain = make(), make()
    optimizer = ScaledSignSGD(model.parameters(), lr=0.05, scale=0.1, name="mine") if given == "object" else \
        (lambda params: ScaledSignSGD(params, lr=0.05, scale=0.1, name="mine"))
    result = dptrain.fit(model, (X, y), epochs=1, batch_size=16, shuffle=False, devices=devices, log=None,
                         optimizer=optimizer)
    plain_steps(plain, ScaledSignSGD(plain.parameters(), lr=0.05, scale=0.1), X, y)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    assert result["history"]


def test_an_optimizer_that_needs_an_argument_to_be_rebuilt_is_refused_with_the_fix():
    model = make()
    with pytest.raises(TypeError, match="Needs cannot be built again for each device .*give that argument a default"):
        dptrain.fit(model, (torch.randn(8, 6), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                    devices="cpu:0", optimizer=Needs(model.parameters(), "cosine"))


def test_a_factory_written_for_the_model_is_told_it_gets_the_parameters_and_how_to_give_groups():
    model = make()
    factory = lambda m: torch.optim.AdamW([{"params": [p for n, p in m.named_parameters() if "0." in n]}])  # noqa: E731
    with pytest.raises(TypeError, match=r"given the list of parameters.*build the optimizer on the model") as e:
        dptrain.fit(model, (torch.randn(8, 6), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                    devices="cpu:0", optimizer=factory)
    assert isinstance(e.value.__cause__, AttributeError)        # the user's own frames, chained


@pytest.mark.parametrize("given", ["trainer", "combined", "turns"])
def test_an_optimizer_whose_step_needs_a_closure_is_refused_where_none_can_be_given(given):
    """fit steps LBFGS alone with a closure (tests/engine/test_closure_step.py); a Trainer of the
    user's loop, and an optimizer among several, have no closure to give it."""
    model = make()
    before = [p.detach().clone() for p in model.parameters()]
    first, rest = list(model.parameters())[:2], list(model.parameters())[2:]
    with pytest.raises(ValueError, match=r"LBFGS.step needs a closure .*dptrain.fit steps it with one.*when it is "
                                         r"the run's only optimizer.*use a first-order optimizer"):
        if given == "trainer":
            dptrain.Trainer(dptrain.replicate(model, ["cpu:0", "cpu:1"]), torch.optim.LBFGS)
        elif given == "combined":
            dptrain.fit(model, (torch.randn(8, 6), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                        devices=2, optimizer=[torch.optim.LBFGS(first), torch.optim.SGD(rest)])
        else:
            step = lambda m, batch: nn.functional.cross_entropy(m(batch[0]), batch[1])   # noqa: E731
            dptrain.fit(model, (torch.randn(8, 6), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                        devices=2, step={"a": step, "b": step},
                        optimizer={"a": torch.optim.LBFGS(first), "b": torch.optim.SGD(rest)})
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


class Wraps(torch.optim.Optimizer):
    """Keeps an optimizer made from a class it was given, under a name its constructor does not take."""

    def __init__(self, params, inner=torch.optim.SGD, lr=0.01):
        super().__init__(params, {"lr": lr})
        self.base = inner(self.param_groups, lr=lr)
        self.param_groups = self.base.param_groups

    @torch.no_grad()
    def step(self, closure=None):
        self.base.step()


def test_a_wrapped_optimizer_the_rebuild_would_change_is_named():
    """SAM's base_optimizer=Adam came back as SGD, its default, on every device (silently); now
    the class is given again under the argument's name (tests/engine/test_closure_step.py), and
    an attribute named otherwise is an error."""
    model = make()
    with pytest.raises(TypeError, match=r"Wraps keeps base, a Adam, which building it again for each device as "
                                        r"Wraps\(param_groups, \*\*defaults\) makes a SGD: take its class as an "
                                        r"argument named 'base'"):
        dptrain.fit(model, (torch.randn(8, 6), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                    devices=2, optimizer=Wraps(model.parameters(), inner=torch.optim.Adam))
