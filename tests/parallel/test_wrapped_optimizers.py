"""Optimizers of the shapes users bring from other libraries, on any devices, exactly as the
plain loop (``optimizer_shapes.py``): a Lookahead built on an optimizer instance (timm's shape: its step counter in the
groups, its slow weights in the wrapped one's state; alphadl's: a counter attribute, its own
state), and one whose step size is one value over the whole group, kept in the group and
changed by each step (Prodigy's and D-Adaptation's ``d`` and ``k``). Checkpoints resume them bit
for bit, and a second ``fit`` with the same object goes on where the first stopped."""
import pytest
import torch
from torch import nn

import dptrain
from tests.parallel.optimizer_shapes import AlphadlShape, GroupStepSize, RelativeStep, TimmShape
from tests.parallel.plain_loop import plain_steps


class Stubborn(TimmShape):
    def __init__(self, base_optimizer, every):          # an argument with no default
        super().__init__(base_optimizer, k=every)


OPTIMIZERS = {
    "group step size": lambda params: GroupStepSize(params),
    "timm lookahead": lambda params: TimmShape(torch.optim.AdamW(params, lr=0.01), alpha=0.6, k=4),
    "alphadl lookahead": lambda params: AlphadlShape(torch.optim.Adam(params, lr=0.01), alpha=0.6, k=4),
    "relative step": lambda params: RelativeStep(params),
}


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(96, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (96,), generator=g)


def fit(model, optimizer, epochs=1, **kwargs):
    kwargs = {"devices": "cpu:0,cpu:1,cpu:2", **kwargs}
    return dptrain.fit(model, data(), epochs=epochs, batch_size=16, shuffle=False, log=None, progress=False,
                       optimizer=optimizer, **kwargs)


def assert_as_plain(model, make_optimizer, epochs):
    plain = make()
    plain_steps(plain, make_optimizer(plain.parameters()), *data(), epochs=epochs)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("kvstore", ["device", "local"])
def test_trains_as_the_plain_loop_on_three_devices(name, kvstore):
    model = make()
    fit(model, OPTIMIZERS[name](model.parameters()), epochs=2, kvstore=kvstore)
    assert_as_plain(model, OPTIMIZERS[name], epochs=2)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_checkpoint_resumes_it_bit_for_bit_on_other_devices(name, tmp_path):
    first = make()
    fit(first, OPTIMIZERS[name](first.parameters()), epochs=1, checkpoint_dir=str(tmp_path), devices="cpu:0,cpu:1")
    model = make()
    fit(model, OPTIMIZERS[name](model.parameters()), epochs=2, checkpoint_dir=str(tmp_path), resume=True)
    assert_as_plain(model, OPTIMIZERS[name], epochs=2)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_second_fit_with_the_same_object_goes_on_where_the_first_stopped(name):
    model = make()
    optimizer = OPTIMIZERS[name](model.parameters())
    fit(model, optimizer, devices="cpu:0,cpu:1")
    fit(model, optimizer)
    assert_as_plain(model, OPTIMIZERS[name], epochs=2)
    plain = make()
    plain_optimizer = OPTIMIZERS[name](plain.parameters())
    plain_steps(plain, plain_optimizer, *data(), epochs=2)
    for ours, theirs in zip(optimizer.param_groups, plain_optimizer.param_groups):     # (its step counters)
        assert {k: ours[k] for k in theirs if k != "params"} == {k: v for k, v in theirs.items() if k != "params"}
    assert getattr(optimizer, "step_counter", None) == getattr(plain_optimizer, "step_counter", None)


def test_a_wrapper_that_cannot_be_built_again_on_its_optimizer_is_refused_with_the_fix():
    model = make()
    with pytest.raises(TypeError, match=r"Stubborn, built on a AdamW, cannot be built again .*give its other "
                                        r"arguments defaults"):
        fit(model, Stubborn(torch.optim.AdamW(model.parameters()), every=3))


@pytest.mark.parametrize("devices", ["cpu:0", "cpu:0,cpu:1,cpu:2"])
def test_a_step_size_over_the_group_as_a_part_of_several_optimizers_on_one_loss(devices):
    def optimizers(model):
        return {"body": GroupStepSize(model[0].parameters()), "head": torch.optim.Adam(model[2].parameters(), lr=0.01)}
    model, plain = make(), make()
    fit(model, optimizers(model), epochs=2, devices=devices, kvstore="device")
    parts = optimizers(plain)
    X, y = data()
    for _ in range(2):
        for i in range(0, len(X), 16):
            for optimizer in parts.values():
                optimizer.zero_grad()
            torch.nn.functional.cross_entropy(plain(X[i:i + 16]), y[i:i + 16]).backward()
            for optimizer in parts.values():
                optimizer.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_an_optimizer_with_no_learning_rate_trains_and_logs_none():
    """Adafactor's relative step (lr=None, Hugging Face's T5 recipe) was refused: "the learning
    rate of parameter group 0 must be a finite number >= 0, got None"."""
    model = make()
    result = fit(model, RelativeStep(model.parameters()), log_every_n_steps=2)
    assert_as_plain(model, OPTIMIZERS["relative step"], epochs=1)
    assert all("lr" not in row for row in result["history"] + result["step_history"])
