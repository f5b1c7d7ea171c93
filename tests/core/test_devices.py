import pytest
import torch

import dptrain
from dptrain.core.devices import check_devices, device_info, format_devices, parse_devices

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")


def test_virtual_cpu_devices_are_distinct():
    assert dptrain.cpu(0) != dptrain.cpu(1)
    assert str(dptrain.cpu(1)) == "cpu:1"


def test_naming_a_missing_gpu_lists_what_exists():
    with pytest.raises(ValueError, match=r"cuda:0 does not exist: this machine has no GPU \(available: virtual CPU"):
        dptrain.gpu(0)
    with pytest.raises(ValueError, match="cuda:1 does not exist"):
        parse_devices("cpu:0,cuda:1")


def test_discovery_never_returns_an_empty_list(capsys):
    assert dptrain.num_gpus() == 0
    assert dptrain.try_all_gpus() == [dptrain.cpu(0)]
    assert dptrain.try_gpu(3) == dptrain.cpu(0)
    # The fallback is announced in one line on stderr, not an exception.
    err = capsys.readouterr().err
    assert all(line.startswith("dptrain: ") for line in err.splitlines())


@pytest.mark.parametrize("spec, expected", [
    ("auto", ["cpu:0", "cpu:1"]),
    (None, ["cpu:0", "cpu:1"]),
    ("3", ["cpu:0", "cpu:1", "cpu:2"]),
    (1, ["cpu:0"]),
    ("cpu:0,cpu:1", ["cpu:0", "cpu:1"]),
    (" cpu:2 , cpu:0 ", ["cpu:2", "cpu:0"]),
    ("cpu", ["cpu:0"]),
    ([torch.device("cpu", 1), "cpu:0"], ["cpu:1", "cpu:0"]),
    (torch.device("cpu"), ["cpu:0"]),                  # (was "'torch.device' object is not iterable")
    ([0, 1], ["cpu:0", "cpu:1"]),                      # Lightning's GPU indices; virtual devices without one
])
def test_parse_devices(spec, expected):
    assert [str(d) for d in parse_devices(spec)] == expected


@pytest.mark.parametrize("spec, message", [
    ("0", "a device count must be at least 1"),
    ("tpu:0", "unknown device 'tpu:0'"),
    ("banana", "unknown device 'banana'"),
    ([], "the device list is empty"),
    ([-1], "a device index must be at least 0"),
])
def test_parse_devices_rejects_bad_lists(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_devices(spec)


def test_format_devices_matches_the_reference():
    assert format_devices([dptrain.cpu(0), dptrain.cpu(1)]) == "[cpu:0, cpu:1]"


def test_device_info_divides_the_cores():
    rows = device_info(check_devices(["cpu:0", "cpu:1"]))
    assert [r["device"] for r in rows] == ["cpu:0", "cpu:1"]
    assert all(r["kind"] == "virtual cpu" and r["cores"] >= 1 and r["memory_bytes"] > 0 for r in rows)
