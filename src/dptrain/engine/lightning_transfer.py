"""A LightningModule's own ``on_after_batch_transfer``: a batch changed on its device (Lightning's
documented place for augmentation on the GPU), and the stage its trainer says.

    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        if self.trainer.training:               # not when validating, testing or predicting
            x = self.augment(x)                 # (a kornia pipeline: on the batch's device)
        return x, y

``fit``, ``dptrain.evaluate`` and ``dptrain.predict`` call it on each device's part of each
batch, once it is on that device, on that device's copy of the module (its ``self.augment`` is
the copy's, on the device), with ``dataloader_idx`` 0, before ``training_step``,
``validation_step``, ``test_step`` or ``predict_step`` (or the forward pass) take it: on one
device, the batch as Lightning's ``Trainer`` gives it. Its trainer's ``training``,
``validating``, ``testing`` and ``predicting`` say which of those will (``TrainerStandIn.stage``,
set by ``LightningSteps`` and by ``lightning_adopt.staged`` for ``evaluate`` and ``predict``).
On several devices it sees a part of the batch at a time, so what it does must be done sample by
sample (a per-sample augmentation is; a batch's own statistic is the part's); random draws in it
are each device's own, as a DDP process's are.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn


def transfer_of(model: nn.Module) -> Callable[..., Any]:
    """The module's own ``on_after_batch_transfer`` as ``fn(replica, batch, trainer=None)``
    (``trainer``: the stand-in to give a device's copy that has none, as ``predict`` has it)."""
    hook = type(model).on_after_batch_transfer

    def moved(net: nn.Module, batch: Any, trainer: Any = None) -> Any:
        module = net._modules.get("_orig_mod", net)     # (a compiled replica: the module's method on its wrapper)
        if trainer is not None and module.__dict__.get("_trainer") is not trainer:
            module.__dict__["_trainer"] = trainer
        return hook.__get__(net)(batch, 0)
    return moved
