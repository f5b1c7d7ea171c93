"""Signal a training subprocess at a known point: inside its second epoch."""
import subprocess
import time

import pytest


def signal_in_second_epoch(proc: subprocess.Popen, metrics, sig, timeout: float = 120.0) -> str:
    """Wait until ``metrics`` (the run's ``--metrics`` file) has epoch 1, send ``sig``, return stderr.

    Skips the test if the run ended before the signal could land."""
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text().strip()) and proc.poll() is None:
        assert time.monotonic() < deadline, "epoch 1 did not end"
        time.sleep(0.05)
    time.sleep(0.5)                    # inside epoch 2
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    if proc.returncode == 0:
        pytest.skip("the run ended before the signal")
    return err
