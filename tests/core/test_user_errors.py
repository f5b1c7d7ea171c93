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
        f"(in your code: {__file__}, line {Broken.forward.__code__.co_firstlineno + 1}, in forward; " in line
    assert line.endswith("; while training epoch 1, batch 1)"), line      # where in the run


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
                                                   f"{tmp_path / 'tasks.py'}, line 2, in make; while building the "
                                                   f"task ({tmp_path / 'tasks.py'}:make))")


class FailsAt(torch.utils.data.Dataset):
    """A Dataset whose 40th read raises: batch 5 of epoch 1 with batches of 8, one read each."""
    def __len__(self):
        return 64

    def __getitem__(self, i):
        FailsAt.reads += 1
        if FailsAt.reads == 40:
            raise OSError("disk went away")
        return torch.randn(4), i % 2


@pytest.mark.parametrize("devices", [1, 2])
def test_a_failure_says_where_in_the_run_it_happened(devices):
    """The batch being read or trained names itself; a script's traceback carries it as a note."""
    class Started(dptrain.Callback):
        last = 0

        def on_batch_start(self, run, epoch, batch):
            Started.last = batch
    FailsAt.reads = 0
    with pytest.raises(OSError) as raised:
        dptrain.fit(nn.Linear(4, 2), FailsAt(), epochs=2, batch_size=8, devices=devices, log=None,
                    callbacks=[Started()])
    _, line = user_failure(raised.value)
    assert Started.last >= 3                           # it failed in training, while reading the next batch
    assert line.endswith(f"; while training epoch 1, batch {Started.last + 1})"), line
    if sys.version_info >= (3, 11):
        assert raised.value.__notes__ == [f"dptrain: raised while training epoch 1, batch {Started.last + 1}"]


def test_a_callback_that_fails_at_the_end_of_an_epoch_is_placed_there():
    class Breaks(dptrain.Callback):
        def on_epoch_end(self, run, epoch, row):
            if epoch == 2:
                raise KeyError("history")
    with pytest.raises(KeyError) as raised:
        dptrain.fit(nn.Linear(4, 2), (torch.randn(32, 4), torch.randint(0, 2, (32,))), epochs=3, batch_size=8,
                    devices=1, log=None, callbacks=[Breaks()])
    assert user_failure(raised.value)[1].endswith("; while ending epoch 2 (callbacks and scheduler))")
