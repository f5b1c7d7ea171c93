"""A LightningModule's own ``on_after_batch_transfer``: a batch changed on its device (Lightning's
documented place for augmentation on the GPU), and the stage its trainer says.

    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        if self.trainer.training:               # not when validating, testing or predicting
            x = self.augment(x)                 # (a kornia pipeline: on the batch's device)
        return x, y

A ``LightningDataModule``'s own (given to ``fit``, ``evaluate`` or ``predict``) is taken first, as
Lightning's ``Trainer`` takes it (its ``trainer`` then the stand-in). ``fit``, ``dptrain.evaluate``
and ``dptrain.predict`` call it on each device's part of each
batch, once it is on that device, on that device's copy of the module (its ``self.augment`` is
the copy's, on the device), with ``dataloader_idx`` 0, before ``training_step``,
``validation_step``, ``test_step`` or ``predict_step`` (or the forward pass) take it: on one
device, the batch as Lightning's ``Trainer`` gives it. Its trainer's ``training``,
``validating``, ``testing`` and ``predicting`` say which of those will (``TrainerStandIn.stage``,
set by ``LightningSteps`` and by ``lightning_adopt.staged`` for ``evaluate`` and ``predict``).
On several devices it sees a part of the batch at a time, so what it does must be done sample by
sample (a per-sample augmentation is; a batch's own statistic is the part's); random draws in it
are each device's own, as a DDP process's are.

Its ``on_before_batch_transfer(batch, dataloader_idx)`` (Lightning's place for work on the batch
before it moves: a CPU-side preprocessing, a dtype) runs once a process, on the module (or the
data module's first), on this process's batch as its loader gives it, before it is cut into the
devices' parts (``before_transfer_of``): the batch then seen by every hook and step is what it
gave. It must keep the batch's samples (fit counts and splits them as read).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

from ..data.accumulate import MicroBatches
from ..data.batch import batch_size as size_of


def transfer_of(model: nn.Module, datamodule: Any = None,
                hook_name: str = "on_after_batch_transfer") -> Optional[Callable[..., Any]]:
    """The ``on_after_batch_transfer`` (or ``hook_name``) that runs, as ``fn(replica, batch,
    trainer=None)``: the data module's if it has its own (Lightning's ``Trainer`` takes it first),
    else the module's, else None. ``trainer``: the stand-in to give a device's copy (or the data
    module) without one."""
    from .lightning_module import overridden        # (lightning_module makes its steps with this)
    if datamodule is not None and overridden(datamodule, [hook_name]):
        def from_data(net: nn.Module, batch: Any, trainer: Any = None) -> Any:
            if trainer is not None and getattr(datamodule, "trainer", None) is not trainer:
                datamodule.trainer = trainer            # (Lightning's: the data module's trainer is the run's)
            return getattr(datamodule, hook_name)(batch, 0)
        return from_data
    if not overridden(model, [hook_name]):
        return None
    hook = getattr(type(model), hook_name)

    def moved(net: nn.Module, batch: Any, trainer: Any = None) -> Any:
        module = net._modules.get("_orig_mod", net)     # (a compiled replica: the module's method on its wrapper)
        if trainer is not None and module.__dict__.get("_trainer") is not trainer:
            module.__dict__["_trainer"] = trainer
        return hook.__get__(net)(batch, 0)
    return moved


def before_transfer_of(model: nn.Module, datamodule: Any = None) -> Optional[Callable[..., Any]]:
    """The ``on_before_batch_transfer`` that runs (the data module's first, as ``transfer_of``),
    as ``fn(batch, trainer=None, stage=None)``: once a process, on the module, on this process's
    batch as its loader gives it (each micro-batch of an accumulated group), before it is cut
    into the devices' parts, its trainer saying ``stage`` (``"train"``, ``"validate"``...); it
    must keep the batch's samples (the run counts and splits them as read). None without one."""
    hook = transfer_of(model, datamodule, "on_before_batch_transfer")
    if hook is None:
        return None

    def before(batch: Any, trainer: Any = None, stage: Optional[str] = None) -> Any:
        if isinstance(batch, MicroBatches):
            return MicroBatches([before(b, trainer, stage) for b in batch])
        if trainer is not None and stage is not None:
            trainer.stage = stage
        n = _samples(batch)
        out = hook(model, batch, trainer)
        if n is not None and _samples(out) != n:
            raise ValueError(f"on_before_batch_transfer gave a batch of {_samples(out)} samples for one of {n}: fit "
                             f"reads, counts and splits each batch as its loader gives it, so the hook must keep its "
                             f"samples (change them, not their number; a filter belongs in the Dataset)")
        return out
    return before


def _samples(batch: Any) -> Optional[int]:
    try:
        return size_of(batch)
    except (TypeError, ValueError):         # (a batch object of one's own: not counted here)
        return None
