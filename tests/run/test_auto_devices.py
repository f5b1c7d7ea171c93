"""devices="auto" on a CPU: virtual devices only where a few measured steps say they pay."""
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


def test_compute_bound_steps_get_a_short_probe_whose_choice_follows_the_times(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "COMPUTE_BOUND_S", 0.0)
    steps = {1: 0, 2: 0}
    real = auto_devices.ModelEngine.train_batch

    def counted(self, batch, **kw):
        steps[len(self.devices)] += 1
        return real(self, batch, **kw)
    monkeypatch.setattr(auto_devices.ModelEngine, "train_batch", counted)
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)       # one device "faster": kept
    result, said = fit(tiny(), capsys)
    probe = auto_devices.WARM_UP + auto_devices.TIMED // auto_devices.BLOCKS
    assert steps == {1: probe + 2 * 8, 2: sum(auto_devices.SHORT)}      # the probe, then 2 epochs of 8 steps
    assert len(said) == 1 and "compute-bound, a short probe" in said[0]
    assert result["devices"] == ["cpu:0"]
    monkeypatch.setattr(auto_devices, "MARGIN", 1e9)            # the virtual devices "faster": taken
    result, said = fit(tiny(), capsys)
    assert result["devices"] == ["cpu:0", "cpu:1"] and "dptrain: devices auto: cpu:0, cpu:1:" in said[0]


def test_no_measurement_where_the_devices_are_given_or_quiet(capsys, monkeypatch):
    monkeypatch.setattr(auto_devices, "MARGIN", 0.0)
    result, said = fit(tiny(), capsys, devices="cpu:0,cpu:1")
    assert result["devices"] == ["cpu:0", "cpu:1"] and said == []
    result, said = fit(tiny(), capsys, log=None)
    assert result["devices"] == ["cpu:0"] and said == []      # measured, not said


def test_the_virtual_devices_are_taken_when_clearly_faster(capsys, monkeypatch):
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
