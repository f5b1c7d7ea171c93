"""The user's own failing code is shown with their frames only, and one line naming it."""
import subprocess
import sys

import pytest
import torch
from torch import nn

import dptrain
from dptrain.core.user_errors import user_failure


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x.view(-1, 5))          # the user's bug


def test_a_model_that_fails_on_a_device_thread_shows_only_the_users_frames():
    try:
        dptrain.fit(Broken(), (torch.randn(16, 4), torch.randint(0, 2, (16,))), epochs=1, batch_size=8, devices=2,
                    log=None)
    except RuntimeError as e:
        shown, line = user_failure(e)
    assert "in forward" in shown and "x.view(-1, 5)" in shown
    assert "dptrain" + "/" not in shown.replace("test_user_errors", "") and "module.py" not in shown
    assert line.startswith("RuntimeError: shape '[-1, 5]' is invalid") and \
        f"(in your code: {__file__}, line {Broken.forward.__code__.co_firstlineno + 1}, in forward)" in line


def test_the_chain_is_kept_in_pythons_order_and_dptrains_own_bug_is_not_hidden():
    def load():
        try:
            {}["features"]
        except KeyError as e:
            raise ValueError("no features column") from e
    try:
        load()
    except ValueError as e:
        shown, line = user_failure(e)
    assert shown.index("KeyError") < shown.index("direct cause") < shown.index("ValueError: no features")
    assert line.startswith("ValueError: no features column (in your code:")
    from dptrain.core.parts import even_parts
    with pytest.raises(Exception) as raised:
        even_parts(5, 0)                       # raised inside dptrain
    raised.value.__traceback__ = raised.value.__traceback__.tb_next     # without this test's own frame
    assert user_failure(raised.value) is None


def test_the_cli_prints_the_users_traceback_and_one_line(tmp_path):
    (tmp_path / "tasks.py").write_text("def make(config):\n    raise RuntimeError('my factory broke')\n")
    out = subprocess.run([sys.executable, "-m", "dptrain", "train", "--recipe", str(tmp_path / "tasks.py") + ":make"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback (your code; dptrain's frames left out)" in out.stderr and "src/dptrain" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (f"dptrain: error: RuntimeError: my factory broke (in your code: "
                                                   f"{tmp_path / 'tasks.py'}, line 2, in make)")
