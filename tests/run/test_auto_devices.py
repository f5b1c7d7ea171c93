"""devices="auto" on a CPU: virtual devices only where a few measured steps say they pay."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.run import auto_devices


def data(n=512):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 8, generator=g)
    return X, X[:, :3].argmax(1)


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def fit(model, capsys, **kw):
    result = dptrain.fit(model, data(), epochs=2, batch_size=64, lr=0.2, optimizer=torch.optim.SGD,
                         progress=False, **kw)
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    return result, said


def test_a_tiny_model_trains_on_one_device_untouched_by_the_measurement(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)       # one device, whatever the timings (a busy CI)
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)     # measured, however slow a busy machine makes a step
    model = tiny()
    result, said = fit(model, capsys)
    assert result["devices"] == ["cpu:0"]
    assert len(said) == 1 and said[0].startswith("dptrain: devices auto: cpu:0: a step took ")
    assert "ms on one device" in said[0] and "ms on 2 virtual devices" in said[0] and "devices=" in said[0]
    alone = tiny()                   # the same run on cpu:0 by hand: the probe changed nothing
    plain, said_plain = fit(alone, capsys, devices="cpu:0")
    assert said_plain == []
    assert [r["train_loss"] for r in result["history"]] == [r["train_loss"] for r in plain["history"]]
    for a, b in zip(model.parameters(), alone.parameters()):
        assert torch.equal(a, b)


def counting(monkeypatch, fail_below=0):
    """Counts ``train_batch`` calls by device count; batches under ``fail_below`` raise (a
    model whose shapes are fixed to its batch)."""
    steps = {1: 0, 2: 0}
    real = auto_devices.ModelEngine.train_batch

    def counted(self, batch, **kw):
        if batch[0].shape[0] < fail_below:
            raise RuntimeError("shape '[64, -1]' is invalid for input of size 16")
        steps[len(self.devices)] += 1
        return real(self, batch, **kw)
    monkeypatch.setattr(auto_devices.ModelEngine, "train_batch", counted)
    return steps


def test_a_model_too_slow_to_measure_within_the_budget_keeps_one_device_after_a_small_look(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "BUDGET_S", 0.0)       # every step "too long"
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)         # were the virtual devices measured, they would win
    steps = counting(monkeypatch)
    result, said = fit(tiny(), capsys)
    assert steps == {1: 2 + 2 * 8, 2: 0}           # two steps on PEEK samples, then 2 epochs of 8 steps
    assert result["devices"] == ["cpu:0"]
    assert len(said) == 1 and said[0].startswith("dptrain: devices auto: cpu:0: a step of 2 samples took ")
    assert "so measuring 2 virtual devices would take over 0.0 s and 1% of this run's 16 steps: not measured" in said[0]
    assert "devices=" in said[0]


def test_a_run_long_enough_to_pay_for_the_measurement_is_measured_however_slow_its_steps(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "BUDGET_S", 0.0)       # every step "too long" ...
    monkeypatch.setattr(auto_devices, "FRACTION", 1.0)       # ... but the run's 16 steps pay for the 16 measured
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)
    steps = counting(monkeypatch)
    result, said = fit(tiny(), capsys)
    per_side = auto_devices.WARM_UP + auto_devices.TIMED
    assert steps == {1: per_side, 2: per_side + 2 * 8}         # no small look: the probe, then the run
    assert result["devices"] == ["cpu:0", "cpu:1"] and "(median of 6)" in said[0]


def test_max_batches_shortens_the_run_the_budget_is_judged_on(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "BUDGET_S", 0.0)
    monkeypatch.setattr(auto_devices, "FRACTION", 1.0)       # 16 steps would pay for the measurement ...
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)
    steps = counting(monkeypatch)
    result, said = fit(tiny(), capsys, max_batches=4)         # ... but the run takes 2 x 4
    assert steps == {1: 2 + 2 * 4, 2: 0}
    assert result["devices"] == ["cpu:0"] and "100% of this run's 8 steps: not measured" in said[0]


def test_without_the_small_look_the_first_full_steps_decide(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "BUDGET_S", 0.0)
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)
    monkeypatch.setattr(auto_devices, "PEEK", 64)          # the batch is no larger: no small look
    steps = counting(monkeypatch)
    result, said = fit(tiny(), capsys)
    assert steps == {1: auto_devices.WARM_UP + 2 * 8, 2: 0}
    assert result["devices"] == ["cpu:0"] and said[0].startswith("dptrain: devices auto: cpu:0: a step took ")
    assert "not measured" in said[0]


def test_a_model_that_cannot_take_the_small_look_is_measured_as_usual(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)          # the virtual devices "faster": taken
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)
    steps = counting(monkeypatch, fail_below=16)               # PEEK samples raise; 32 a device do not
    result, said = fit(tiny(), capsys)
    per_side = auto_devices.WARM_UP + auto_devices.TIMED
    assert steps == {1: per_side, 2: per_side + 2 * 8}
    assert result["devices"] == ["cpu:0", "cpu:1"] and "(median of 6)" in said[0]


def test_no_measurement_where_the_devices_are_given_or_quiet(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)
    result, said = fit(tiny(), capsys, devices="cpu:0,cpu:1")
    assert result["devices"] == ["cpu:0", "cpu:1"] and said == []
    result, said = fit(tiny(), capsys, log=None)
    assert result["devices"] == ["cpu:0"] and said == []      # measured, not said


def test_a_dataloader_with_workers_is_not_measured_as_loading_workers_are_not(capsys, monkeypatch):
    from torch.utils.data import DataLoader, TensorDataset
    probed, real = [], auto_devices.choose
    monkeypatch.setattr(auto_devices, "choose", lambda *a, **k: probed.append(1) or real(*a, **k))
    X, y = data()
    result = dptrain.fit(tiny(), DataLoader(TensorDataset(X, y), batch_size=64, num_workers=1), epochs=1, lr=0.2,
                         optimizer=torch.optim.SGD, progress=False, max_batches=2)
    assert probed == [] and result["devices"] == ["cpu:0", "cpu:1"]      # the virtual devices stay, as with num_workers=
    result = dptrain.fit(tiny(), DataLoader(TensorDataset(X, y), batch_size=64), epochs=1, lr=0.2,
                         optimizer=torch.optim.SGD, progress=False, max_batches=2, devices="auto")
    assert probed == [1]             # without workers it is measured


def test_the_virtual_devices_are_taken_when_clearly_faster(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)       # the slowed steps measured all the same
    calls = []
    real = auto_devices.ModelEngine.train_batch

    def slow_on_one(self, batch, **kw):      # one device made slow: the choice must follow
        if len(self.devices) == 1:
            calls.append(1)
            import time
            time.sleep(0.05)
        return real(self, batch, **kw)
    monkeypatch.setattr(auto_devices.ModelEngine, "train_batch", slow_on_one)
    result, said = fit(tiny(), capsys)
    assert calls and result["devices"] == ["cpu:0", "cpu:1"]
    assert said[0].startswith("dptrain: devices auto: cpu:0, cpu:1: a step took ")


def test_a_resumed_run_keeps_the_devices_its_checkpoints_run_chose(capsys, monkeypatch, tmp_path):
    """Measured again, the resumed run could choose the other way, and differ from the unbroken
    run by float rounding: it takes the checkpoint's devices, bit for bit the unbroken run."""
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)       # one device, whatever the timings
    whole = tiny()
    unbroken, _ = fit(whole, capsys)
    fit(tiny(), capsys, max_steps=10, checkpoint_dir=str(tmp_path))
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)       # measured now, the virtual devices would win
    model, lines = tiny(), []
    result = dptrain.fit(model, data(), epochs=2, batch_size=64, lr=0.2, optimizer=torch.optim.SGD, progress=False,
                         checkpoint_dir=str(tmp_path), resume=True, log=lines.append)
    assert result["devices"] == ["cpu:0"] and unbroken["devices"] == ["cpu:0"]
    assert any("devices auto: resuming on 1 of the 2 devices, as the checkpoint's run chose" in line for line in lines)
    for a, b in zip(model.parameters(), whole.parameters()):
        assert torch.equal(a, b)


def test_the_measurement_builds_the_optimizer_object_given_as_the_run_does(capsys, monkeypatch):
    """It was built as type(optimizer)(params): a Lookahead built on an optimizer failed ('list'
    object has no attribute 'param_groups'), and others were measured with default settings."""
    from tests.parallel.optimizer_shapes import TimmShape
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)
    built = []
    real = auto_devices.on_copy

    def seen(optimizer, model, copied):
        made = real(optimizer, model, copied)
        built.append(made)
        return made
    monkeypatch.setattr(auto_devices, "on_copy", seen)
    model, calls = tiny(), []
    optimizer = TimmShape(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5), k=3)
    optimizer.register_step_post_hook(lambda *_: calls.append(1))
    result = dptrain.fit(model, data(), epochs=2, batch_size=64, optimizer=optimizer, progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    assert len(said) == 1 and "ms on 2 virtual devices" in said[0] and result["devices"] == ["cpu:0"]
    assert len(built) == 2 and all(isinstance(b, TimmShape) for b in built)
    assert [g["momentum"] for b in built for g in b.param_groups] == [0.5, 0.5]
    assert len(calls) == 16          # the run's steps only (8 a epoch), not the measurement's


def test_the_hooks_of_an_optimizer_a_factory_makes_run_on_the_runs_steps_only(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)
    calls = []

    def adam(params):
        optimizer = torch.optim.Adam(params, lr=0.01)
        optimizer.register_step_post_hook(lambda *_: calls.append(1))
        return optimizer
    result = dptrain.fit(tiny(), data(), epochs=2, batch_size=64, optimizer=adam, progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    assert len(said) == 1 and "ms on 2 virtual devices" in said[0] and result["devices"] == ["cpu:0"]
    assert len(calls) == 16


def test_checkpointed_blocks_drawing_outside_dropout_layers_keep_one_device(capsys, monkeypatch):
    from tests.engine.test_device_streams import Net
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)         # the virtual devices would win, were they measured
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)
    torch.manual_seed(0)
    model = Net("not reentrant", functional=True)
    X = torch.randn(256, 6)
    result = dptrain.fit(model, (X, X[:, :3].argmax(1)), epochs=1, batch_size=64, optimizer=torch.optim.SGD, lr=0.1,
                         progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    assert result["devices"] == ["cpu:0"]
    assert said == ["dptrain: devices auto: cpu:0: the model's checkpointed blocks draw random numbers outside "
                    "dropout layers, which 2 virtual devices cannot replay exactly; pass devices= to choose"]


def test_a_lightning_modules_training_step_reading_its_optimizer_is_measured_as_it_trains(capsys, monkeypatch):
    """self.optimizers() in training_step (a logged lr, Lightning's everyday habit) in the measured steps: the
    probe's optimizer (it had none: the stand-in's AttributeError, raised while choosing the devices)."""
    from tests.engine.test_lightning_module import LightningLike
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)

    class Logs(LightningLike):
        def __init__(self):
            super().__init__()
            self.net = tiny()

        def training_step(self, batch, batch_idx):
            self.log("rate", self.optimizers().param_groups[0]["lr"])
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.2)
    result = dptrain.fit(Logs(), data(), epochs=1, batch_size=64, progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    assert len(said) == 1 and "a step took" in said[0]
    assert result["history"][0]["train_rate"] == pytest.approx(0.2)      # (logged as a float32 tensor)


def test_a_lightning_modules_before_transfer_hook_runs_on_the_measured_batches(capsys, monkeypatch):
    """Its on_before_batch_transfer makes the uint8 batches float: the probe's steps take them so too."""
    from tests.engine.test_lightning_transfer import Scaled, scaled
    monkeypatch.setattr(auto_devices, "BUDGET_S", 1e9)
    result = dptrain.fit(Scaled(), scaled(), epochs=1, batch_size=16, progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "devices auto" in line]
    assert len(said) == 1 and "a step took" in said[0] and result["history"][0]["train_loss"] > 0
