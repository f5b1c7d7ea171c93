import threading

import pytest
import torch

import dptrain
from dptrain.core.runner import DeviceRunner, get_runner


def test_map_returns_results_in_device_order():
    runner = DeviceRunner([dptrain.cpu(i) for i in range(3)])
    try:
        out = runner.map(lambda i, x: (i, x * 10), [1, 2, 3])
        assert out == [(0, 10), (1, 20), (2, 30)]
    finally:
        runner.close()


def test_devices_really_run_concurrently():
    # Each task waits for the other: run one after the other, the barrier would time out.
    runner = DeviceRunner([dptrain.cpu(0), dptrain.cpu(1)])
    barrier = threading.Barrier(2, timeout=10)
    try:
        assert runner.map(lambda i: barrier.wait() is not None) == [True, True]
    finally:
        runner.close()


def test_intra_op_threads_are_divided_among_cpu_devices():
    runner = DeviceRunner([dptrain.cpu(0), dptrain.cpu(1)], threads_per_cpu_device=1)
    caller = torch.get_num_threads()
    try:
        # Run a real op first: PyTorch's lazy per-thread init must not undo the setting.
        seen = runner.map(lambda i: (torch.ones(64, 64) @ torch.ones(64, 64), torch.get_num_threads())[1])
        assert seen == [1, 1]
        assert torch.get_num_threads() == caller
        with runner.coordinating():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == caller
    finally:
        runner.close()


def test_an_error_on_one_device_reaches_the_caller():
    runner = DeviceRunner([dptrain.cpu(0), dptrain.cpu(1)])

    def work(i):
        if i == 1:
            raise RuntimeError("device 1 failed")
        return i
    try:
        with pytest.raises(RuntimeError, match="device 1 failed"):
            runner.map(work)
        assert runner.map(lambda i: i) == [0, 1]   # still usable afterwards
    finally:
        runner.close()


def test_run_uses_the_named_device_thread():
    runner = DeviceRunner([dptrain.cpu(0), dptrain.cpu(1)])
    try:
        assert runner.run(1, lambda: threading.current_thread().name) == "dptrain-cpu:1"
    finally:
        runner.close()


def test_single_device_runs_inline():
    runner = get_runner([dptrain.cpu(0)])
    assert runner.map(lambda i: threading.current_thread()) == [threading.current_thread()]


def test_map_checks_argument_counts():
    runner = get_runner([dptrain.cpu(0), dptrain.cpu(1)])
    with pytest.raises(ValueError, match=r"one argument per device \(2\), got 3"):
        runner.map(lambda i, x: x, [1, 2, 3])
