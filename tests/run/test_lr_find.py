"""dptrain.lr_find: the learning-rate range test (Lightning's Tuner.lr_find) by fit, on any devices
and processes (run/lr_find.py)."""
import math

import pytest
import torch
from torch import nn

import dptrain
from dptrain.run.lr_find import LRFinder, rates, smoothed
from tests.distributed.helpers import run_workers


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(512, 4, generator=g, dtype=torch.float64)
    return X, X @ torch.randn(4, 1, generator=g, dtype=torch.float64) + 0.1


def made():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def plain(steps, lrs):
    """The range test in a plain loop: every group's rate set before each step, the batches in order."""
    model, (X, Y) = made(), data()
    opt = torch.optim.SGD(model.parameters(), lr=lrs[0], momentum=0.9)
    sums = []
    for k in range(steps):
        s = (k * 32) % 512
        for group in opt.param_groups:
            group["lr"] = lrs[k]
        loss = nn.functional.mse_loss(model(X[s:s + 32]), Y[s:s + 32])
        loss.backward()
        opt.step()
        opt.zero_grad()
        sums.append(loss.item() * 32)
    return smoothed(sums, [32] * steps)


def found(devices=1, **kw):
    model = made()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    before = ([p.clone() for p in model.parameters()], opt.state_dict())
    finder = dptrain.lr_find(model, data(), loss=nn.MSELoss(), optimizer=opt, batch_size=32, shuffle=False,
                             devices=devices, min_lr=1e-4, max_lr=1.0, num_training=kw.pop("num_training", 40), **kw)
    return finder, model, opt, before


@pytest.mark.parametrize("devices", [1, 2])
def test_the_range_test_is_the_plain_loops_and_leaves_the_model_and_its_optimizer_as_they_were(devices):
    finder, model, opt, (weights, state) = found(devices, early_stop_threshold=None)
    lrs = rates(1e-4, 1.0, 40, "exponential")
    assert finder.results["lr"] == lrs and lrs[0] == 1e-4 and lrs[-1] == pytest.approx(1.0)
    assert finder.results["loss"] == pytest.approx(plain(40, lrs), rel=1e-9)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), weights))
    assert opt.state_dict() == state and opt.param_groups[0]["lr"] == 0.5
    suggested = finder.suggestion()
    assert suggested in lrs[10:39]


def test_a_loss_that_runs_away_stops_the_test_early():
    finder, *_ = found(1, num_training=80, early_stop_threshold=4.0)
    losses = finder.results["loss"]
    assert len(losses) < 80 and len(finder.results["lr"]) == len(losses)
    assert (not math.isfinite(losses[-1])) or losses[-1] > 4.0 * min(losses[:-1])


def test_the_suggestion_is_the_steepest_fall_past_the_skipped_ends():
    lrs = [10 ** (-k / 4) for k in range(20, 0, -1)]
    losses = [5.0] * 12 + [4.9, 4.0, 3.0, 2.8, 2.7, 2.6, 9.0, float("nan")]
    finder = LRFinder({"lr": lrs, "loss": losses})
    assert finder.suggestion() == lrs[13]           # (the central difference is steepest there)
    assert LRFinder({"lr": lrs[:5], "loss": losses[:5]}).suggestion() is None


def test_what_the_test_sets_itself_and_bad_settings_are_errors():
    with pytest.raises(ValueError, match="lr_find sets lr, epochs itself"):
        dptrain.lr_find(made(), data(), loss=nn.MSELoss(), lr=0.1, epochs=2)
    with pytest.raises(ValueError, match="0 < min_lr < max_lr"):
        dptrain.lr_find(made(), data(), loss=nn.MSELoss(), min_lr=1.0, max_lr=0.1)
    with pytest.raises(ValueError, match="mode must be 'exponential' or 'linear'"):
        dptrain.lr_find(made(), data(), loss=nn.MSELoss(), mode="cosine")
    assert rates(0.1, 1.0, 10, "linear")[1] == pytest.approx(0.2)


def test_update_attr_sets_the_models_learning_rate():
    model = made()
    model.lr = 0.5
    finder = dptrain.lr_find(model, data(), loss=nn.MSELoss(), batch_size=32, devices=1, min_lr=1e-4,
                             num_training=30, update_attr=True, eval_data=data())     # (not evaluated)
    assert model.lr == finder.suggestion() != 0.5


def _two_processes(rank, world):
    finder, *_ = found(1, early_stop_threshold=None, num_training=20)
    return finder.results


def test_two_processes_get_the_global_batches_results():
    first, second = run_workers(_two_processes)
    assert first == second
    one, *_ = found(1, early_stop_threshold=None, num_training=20)
    assert first["loss"] == pytest.approx(one.results["loss"], rel=1e-9)


def test_a_lightning_modules_configured_scheduler_is_left_out_of_the_test():
    from tests.engine.test_lightning_module import Lit, data as classes
    torch.manual_seed(0)
    configured = dptrain.lr_find(Lit(), classes(), batch_size=16, devices=1, shuffle=False, num_training=30,
                                 early_stop_threshold=None)
    torch.manual_seed(0)
    model = Lit()
    given = dptrain.lr_find(model, classes(), optimizer=torch.optim.Adam(model.parameters(), lr=0.01), batch_size=16,
                            devices=1, shuffle=False, num_training=30, early_stop_threshold=None)
    assert configured.results == given.results and len(given.results["loss"]) == 30


def test_lightnings_auto_lr_find_keyword_names_the_range_test():
    with pytest.raises(TypeError, match=r"'auto_lr_find'; dptrain has none: run finder = dptrain.lr_find\(model, "
                                        r"data, ...\)"):
        dptrain.fit(made(), data(), loss=nn.MSELoss(), auto_lr_find=True)


def test_a_typo_or_lightnings_name_is_said_as_lr_finds():
    with pytest.raises(TypeError, match="lr_find\\(\\) got an unexpected keyword argument 'num_training_steps'; "
                                        "dptrain's is num_training"):
        dptrain.lr_find(made(), data(), loss=nn.MSELoss(), num_training_steps=20)
    with pytest.raises(TypeError, match="lr_find\\(\\) got an unexpected keyword argument 'max_lrr'; did you mean "
                                        "'max_lr'"):
        dptrain.lr_find(made(), data(), loss=nn.MSELoss(), max_lrr=1.0)


@pytest.mark.parametrize("devices", ["1", "2"])
def test_the_commands_test_of_a_task_is_lr_finds_and_leaves_the_model_as_it_was(devices):
    """dptrain train --lr-find: the range test of the recipe's Task (lr_find's defaults), the run's settings."""
    import functools

    from dptrain.run.config import TrainConfig
    from dptrain.run.lr_find import task_lr_find
    sgd = functools.partial(torch.optim.SGD, momentum=0.9)
    want = dptrain.lr_find(made(), data(), loss=nn.MSELoss(), optimizer=sgd, batch_size=32, devices=int(devices),
                           shuffle=False)
    model, lines = made(), []
    task = dptrain.Task(model=model, train_data=data(), eval_data=data(), loss=nn.MSELoss(), optimizer=sgd,
                        epochs=3)
    config = TrainConfig(devices=devices, batch_size=32, shuffle=False, epochs=1)
    found = task_lr_find(task, config, lines.append)
    assert found.lr == want.suggestion() and found.epochs == 1 and config.lr is None
    for got, was in zip(model.parameters(), made().parameters()):
        assert torch.equal(got, was)
    assert len(lines) == 1 and f"suggests lr {want.suggestion():.3g}: training at it" in lines[0]
    with pytest.raises(ValueError, match="--lr-find finds the learning rate and --lr 0.1 gives one: leave one out"):
        task_lr_find(task, TrainConfig(lr=0.1), None)
