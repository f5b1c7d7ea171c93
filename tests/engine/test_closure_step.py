"""An optimizer whose step needs a closure (torch.optim.LBFGS) trains as the plain loop's
optimizer.step(closure) on the whole batch, on 1-3 devices and 2 processes (closure_step.py)."""
import copy
import functools
import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

import dptrain
from tests.distributed.helpers import run_workers

LBFGS = functools.partial(torch.optim.LBFGS, lr=1, max_iter=4, history_size=5, line_search_fn="strong_wolfe")


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(96, 2, generator=g, dtype=torch.float64) * 2 - 1
    return X, torch.sin(3 * X[:, :1]) + X[:, 1:] ** 2


def made():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def plain(epochs=3, batch=32):
    """The plain loop: optimizer.step(closure) on each batch, a scheduler every epoch."""
    model, (X, Y) = made(), data()
    optimizer = LBFGS(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for i in range(0, len(X), batch):
            def closure():
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(X[i:i + batch]), Y[i:i + batch])
                loss.backward()
                return loss
            total += optimizer.step(closure).item() * len(X[i:i + batch])
        losses.append(total / len(X))
        scheduler.step()
    return model, losses


def fitted(devices=1, **kw):
    model = made()
    settings = dict(loss=nn.MSELoss(), optimizer=LBFGS, scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.7),
                    epochs=3, batch_size=32, devices=devices, shuffle=False, log=None, progress=False)
    result = dptrain.fit(model, data(), **{**settings, **kw})
    return model, result


def assert_as_plain(model, result, tolerance):
    reference, losses = plain()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=tolerance, atol=tolerance)
    assert result["history"]["train_loss"] == pytest.approx(losses, rel=tolerance)


@pytest.mark.parametrize("devices, kvstore", [(1, "device"), (2, "device"), (3, "device"), (2, "local")])
def test_lbfgs_with_a_line_search_trains_as_the_plain_loops_closure(devices, kvstore):
    """Every device evaluates as often as the others: the same loss and gradient at each
    evaluation (summed over the devices, divided by the batch), so the same decisions."""
    model, result = fitted(devices, kvstore=kvstore)
    assert_as_plain(model, result, 1e-13 if devices == 1 else 1e-9)
    assert result["history"]["lr"][-1] == pytest.approx(0.49)      # the scheduler stepped it


def two_processes(rank, world):
    model, result = fitted(2)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(), result["history"]["train_loss"]


def test_two_processes_of_two_devices_train_as_the_plain_loop():
    (first, losses), (second, _) = run_workers(two_processes)
    assert first == second              # the ranks took the same decisions
    reference, plain_losses = plain()
    torch.testing.assert_close(torch.tensor(first, dtype=torch.float64),
                               torch.cat([p.detach().reshape(-1) for p in reference.parameters()]),
                               rtol=1e-9, atol=1e-9)
    assert losses == pytest.approx(plain_losses, rel=1e-9)


def test_a_resumed_run_ends_as_the_unbroken_one_and_a_given_optimizer_gets_its_state(tmp_path):
    unbroken, _ = fitted(2)
    fitted(2, epochs=2, checkpoint_dir=str(tmp_path))
    resumed, _ = fitted(2, checkpoint_dir=str(tmp_path), resume=True)
    for p, q in zip(unbroken.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    model = made()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=4)
    dptrain.fit(model, data(), loss=nn.MSELoss(), optimizer=optimizer, epochs=1, batch_size=32, devices=2,
                log=None, progress=False)
    assert optimizer.state_dict()["state"][0]["func_evals"] == 12      # 3 batches of 4 evaluations


@pytest.mark.parametrize("devices", [1, 2])
def test_a_first_loss_not_finite_is_skipped_with_on_nan_skip(devices):
    X, Y = data()
    Y = Y.clone()
    Y[40] = float("nan")            # the second batch
    model = made()
    result = dptrain.fit(model, (X, Y), loss=nn.MSELoss(), optimizer=LBFGS, epochs=1, batch_size=32,
                         devices=devices, shuffle=False, on_nan="skip", log=None, progress=False)
    assert result["history"][-1]["skipped"] == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("setting, said", [({"accumulate_grad_batches": 2}, "accumulate_grad_batches > 1"),
                                           ({"clip_grad_norm": 1.0}, "clip_grad_norm or clip_grad_value"),
                                           ({"amp": "fp16"}, "amp='fp16'")])
def test_what_a_closure_cannot_keep_is_refused_before_any_update(setting, said):
    model = made()
    before = copy.deepcopy(model)
    with pytest.raises(ValueError, match=rf"LBFGS.step needs a closure.*does not go with {said}"):
        dptrain.fit(model, data(), loss=nn.MSELoss(), optimizer=LBFGS, epochs=1, batch_size=32, devices=2,
                    log=None, progress=False, **setting)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before.parameters()))


class Fails(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1).double()

    def forward(self, x):
        if torch.is_grad_enabled() and (x < -0.99).any():      # one device's part, at the first step
            raise RuntimeError("a fault in the user's forward")
        return self.layer(x)


def test_a_device_failing_mid_step_raises_its_error_and_the_others_do_not_wait():
    X, Y = data()
    X = X.clone()
    X[-1] = -1.0            # in the last device's part
    with pytest.raises(RuntimeError, match="a fault in the user's forward"):
        dptrain.fit(Fails(), (X[-4:], Y[-4:]), loss=nn.MSELoss(), optimizer=LBFGS, epochs=1, batch_size=4,
                    devices=2, shuffle=False, log=None, progress=False, timeout=20)


class LitShaped(nn.Module):
    """A LightningModule's shape (its methods are what fit reads): LBFGS from configure_optimizers."""

    def __init__(self):
        super().__init__()
        self.net = made()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return LBFGS(self.parameters())


@pytest.mark.parametrize("devices", [1, 2])
def test_a_lightning_modules_lbfgs_trains_as_the_plain_loop(devices):
    module = LitShaped()
    result = dptrain.fit(module, data(), epochs=1, batch_size=32, devices=devices, shuffle=False, log=None,
                         progress=False)
    reference, losses = plain(epochs=1)
    for p, q in zip(module.net.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-9)
    assert result["history"]["train_loss"] == pytest.approx(losses, rel=1e-9)


@pytest.mark.parametrize("devices", [1, 3])
def test_training_figures_count_each_steps_first_evaluation_alone(devices):
    """train_acc is the accuracy before each update (the loss step returns), not an average
    over the line search's evaluations."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(96, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (96,), generator=g)
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.LBFGS(reference.parameters(), lr=1, max_iter=5)
    correct = 0
    for i in range(0, 96, 32):
        correct += int((reference(X[i:i + 32]).argmax(1) == y[i:i + 32]).sum())

        def closure():
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(reference(X[i:i + 32]), y[i:i + 32])
            loss.backward()
            return loss
        optimizer.step(closure)
    result = dptrain.fit(model, (X, y), optimizer=functools.partial(torch.optim.LBFGS, lr=1, max_iter=5), epochs=1,
                         batch_size=32, devices=devices, shuffle=False, train_metrics=True, log=None, progress=False)
    assert result["history"][-1]["train_acc"] == pytest.approx(correct / 96)


def test_balance_auto_times_every_evaluation_and_trains_as_the_even_split():
    """--balance auto: each device's seconds are its evaluations' together; the parts it picks
    change the sums' order only."""
    even, _ = fitted(2, epochs=2, batch_size=16, scheduler=None)
    balanced, result = fitted(2, epochs=2, batch_size=16, scheduler=None, balance="auto")
    assert sum(result["history"][-1]["split"]) == 16
    for p, q in zip(even.parameters(), balanced.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-9)


def _example():
    spec = importlib.util.spec_from_file_location("sharpness_aware", Path(__file__).parents[2] / "examples" /
                                                  "sharpness_aware.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


#: Sharpness-Aware Minimization as its users copy it (davda54/sam's shape): step() asserts a
#: closure; it steps on the gradient a backward left, then evaluates again.
SAM = _example().SAM


def sam_plain(base, **kw):
    model, (X, Y) = made(), data()
    optimizer = SAM(model.parameters(), base, **kw)
    for _ in range(2):
        for i in range(0, len(X), 32):
            def closure():
                loss = nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32])
                loss.backward()
                return loss
            closure()
            optimizer.step(closure)
            optimizer.zero_grad()
    return model


@pytest.mark.parametrize("devices", [1, 3])
@pytest.mark.parametrize("base, kw", [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                      (torch.optim.Adam, {"lr": 0.01})])
def test_sharpness_aware_minimization_trains_as_the_plain_loop(devices, base, kw):
    """Its step() fails naming the closure (asked once, on stand-ins): the step's first
    evaluation comes before step, the others from it. Its base optimizer stays Adam (a rebuild
    for each device made it SGD, its default, before)."""
    model = made()
    dptrain.fit(model, data(), loss=nn.MSELoss(), optimizer=SAM(model.parameters(), base, **kw), epochs=2,
                batch_size=32, devices=devices, shuffle=False, log=None, progress=False)
    for p, q in zip(model.parameters(), sam_plain(base, **kw).parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"SAM.step needs a closure \(it evaluates the loss again"):
        dptrain.Trainer(dptrain.replicate(made(), ["cpu:0", "cpu:1"]), functools.partial(SAM, lr=0.1))


def sam_two_processes(rank, world):
    model = made()
    dptrain.fit(model, data(), loss=nn.MSELoss(), optimizer=SAM(model.parameters(), torch.optim.Adam, lr=0.01),
                epochs=2, batch_size=32, devices=1, shuffle=False, log=None, progress=False)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def test_sharpness_aware_minimization_on_two_processes_trains_as_the_plain_loop():
    first, second = run_workers(sam_two_processes)
    assert first == second
    torch.testing.assert_close(torch.tensor(first, dtype=torch.float64),
                               torch.cat([p.detach().reshape(-1) for p in sam_plain(torch.optim.Adam,
                                                                                    lr=0.01).parameters()]),
                               rtol=1e-12, atol=1e-12)


def test_sam_resumes_exactly_and_gives_its_base_optimizers_state_back(tmp_path):
    """Adam's moments live in SAM's base_optimizer: checkpoints and the optimizer given back held
    SAM's own state only (a resumed run restarted Adam: weights 0.027 off the unbroken run)."""
    def run(epochs, **kw):
        model = made()
        optimizer = SAM(model.parameters(), torch.optim.Adam, lr=0.01)
        dptrain.fit(model, data(), loss=nn.MSELoss(), optimizer=optimizer, epochs=epochs, batch_size=32,
                    devices=2, log=None, progress=False, **kw)
        return model, optimizer
    unbroken, optimizer = run(3)
    assert len(optimizer.base_optimizer.state) == 4 and all("exp_avg" in s for s in
                                                            optimizer.base_optimizer.state.values())
    run(2, checkpoint_dir=str(tmp_path))
    resumed, _ = run(3, checkpoint_dir=str(tmp_path), resume=True)
    for p, q in zip(unbroken.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
