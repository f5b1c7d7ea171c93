"""Hooks named as Keras and Lightning name theirs, typos of ours, and hooks written with a peer's
arguments are refused before the run, naming the hook to write; everything else is let be."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks import CallbackList


class LightningStyle(dptrain.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pass


class KerasStyle(dptrain.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


class Typo(dptrain.Callback):
    def on_epoch_ends(self, run, epoch, row):
        pass


class SavesCheckpoint(dptrain.Callback):
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        pass


class AfterBackward(dptrain.Callback):
    def on_after_backward(self, trainer, pl_module):
        pass


class BeforeOptimizerStep(dptrain.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        pass


class Fine(dptrain.Callback):
    """Its own helper named on_*, a hook taking *args, and one set on the instance."""
    def __init__(self):
        self.calls = []
        self.on_fit_start = lambda run: self.calls.append("fit_start")

    def on_improvement(self, value):
        self.calls.append(value)

    def on_batch_end(self, run, *rest):
        self.calls.append("batch")


@pytest.mark.parametrize("callback, named", [
    (LightningStyle(), "def on_batch_end(self, run, batch)"),
    (KerasStyle(), "def on_epoch_end(self, run, epoch, row)"),
    (Typo(), "def on_epoch_end(self, run, epoch, row)"),
    (SavesCheckpoint(), "def state_dict(self)"),
    (AfterBackward(), "p.register_hook"),
    (BeforeOptimizerStep(), "read each update's gradients in def on_gradients(self, run, batch, grads)"),
])
def test_a_hook_the_run_would_not_call_is_refused_with_the_one_to_write(callback, named):
    with pytest.raises(TypeError) as error:
        CallbackList([callback])
    assert type(callback).__name__ in str(error.value) and named in str(error.value)


def test_a_callback_of_another_framework_is_refused_naming_its_class():
    foreign = type("EarlyStopping", (), {"__module__": "lightning.pytorch.callbacks.early_stopping",
                                         "on_fit_start": lambda self, trainer, pl_module: None})
    with pytest.raises(TypeError, match=r"EarlyStopping is a lightning.pytorch.callbacks.early_stopping.EarlyStopping"
                                        r".*write it as a dptrain.Callback .its hooks: on_fit_start\(self, run\)"):
        CallbackList([foreign()])


def test_fit_refuses_it_before_training():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    before = model.weight.detach().clone()
    with pytest.raises(TypeError, match="on_train_batch_end.*on_batch_end"):
        dptrain.fit(model, (torch.randn(8, 3), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                    devices="cpu:0", callbacks=[LightningStyle()])
    assert torch.equal(model.weight, before)


def test_helpers_and_flexible_hooks_are_called_as_before():
    fine = Fine()
    dptrain.fit(nn.Linear(3, 2), (torch.randn(8, 3), torch.randint(0, 2, (8,))), epochs=1, batch_size=4, log=None,
                devices="cpu:0", callbacks=[fine])
    assert fine.calls == ["fit_start", "batch", "batch"]
