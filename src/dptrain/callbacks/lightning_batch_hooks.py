"""A ``LightningModule``'s own hooks around each training batch, called by ``fit`` where
Lightning's ``Trainer`` calls them: ``on_train_batch_start(batch, batch_idx)`` before the batch
trains, ``on_train_batch_end(outputs, batch, batch_idx)`` after its update (a momentum encoder's
habit: BYOL's and MoCo's target network follows the online one after each update).

    class BYOL(L.LightningModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            with torch.no_grad():
                for t, o in zip(self.target.parameters(), self.online.parameters()):
                    t.mul_(0.99).add_(o, alpha=0.01)

Each is called once in a process, on the module (the first device's replica), as Lightning's
DDP calls it once a process: ``batch`` is this process's batch as its loader gives it (every
device's part of it), ``batch_idx`` its index in the epoch, ``self.global_step`` the updates done
before it, or with it at its end; ``outputs`` is ``{"loss": the batch's mean loss}`` (this
process's: each device's ``training_step`` gives its own outputs, so only the loss is put
together). What a hook changes (weights written in place, attributes) is given to every device's
copy before the next step: the run watches its batches for edits, as for a callback's
``on_batch_end``. A callback of its own, apart from ``ModuleHooks``: only a module overriding them
pays for that watch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..engine.lightning_module import LightningSteps
from .base import BatchEnd, Callback


class ModuleBatchHooks(Callback):
    """Calls ``hooks`` (those of ``BATCH_HOOKS`` the module overrides) of ``module`` around each
    training batch; ``steps``: its ``LightningSteps``, which holds the batch (``at``) and the
    module's stand-in trainer (``clock``). Only the callback events of the hooks overridden are
    set (on the instance): a run calls an event, and watches for edits after it, only where set."""

    def __init__(self, module: nn.Module, hooks: Sequence[str], steps: LightningSteps):
        self.module, self.hooks, self.steps = module, tuple(hooks), steps
        if "on_train_batch_start" in self.hooks:
            self.on_batch_start = self._batch_start
        if "on_train_batch_end" in self.hooks:
            self.on_batch_end = self._batch_end

    def on_fit_start(self, run: Any) -> None:
        if run.config.accumulate_grad_batches > 1:
            raise ValueError(f"the module's {' and '.join(self.hooks)} with accumulate_grad_batches="
                             f"{run.config.accumulate_grad_batches}: Lightning calls them on every micro-batch, fit "
                             f"steps a group of them at once; give their work to a dptrain.Callback's "
                             f"on_batch_start or on_batch_end (once an update; run.model is the module)")

    def _batch_start(self, run: Any, epoch: int, batch: int) -> None:
        if self.module.on_train_batch_start(self.steps.batch, batch - 1) == -1:
            raise ValueError("the module's on_train_batch_start returned -1 (Lightning: skip the epoch's other "
                             "batches), which fit does not do: give fit max_batches=N to cut every epoch, or set "
                             "self.trainer.should_stop = True to end the run")

    def _batch_end(self, run: Any, batch: BatchEnd) -> None:
        if self.steps.clock is not None:
            self.steps.clock.at(batch.epoch - 1, batch.step)        # (Lightning's: the update done)
        self.module.on_train_batch_end(BatchOutputs(batch), self.steps.batch, batch.batch - 1)


class BatchOutputs(Mapping):
    """``on_train_batch_end``'s ``outputs``: ``{"loss": ...}``, the batch's mean loss over this
    process's devices (a tensor, computed when read); another key is a ``KeyError`` saying why."""

    def __init__(self, batch: BatchEnd):
        self._batch = batch

    def __getitem__(self, key: str) -> torch.Tensor:
        if key != "loss":
            raise KeyError(f"outputs[{key!r}]: in on_train_batch_end, dptrain's outputs hold the batch's loss alone "
                           f"(each device's training_step gives its own outputs): keep what the hook needs on self "
                           f"in training_step")
        return torch.tensor(self._batch.loss)

    def __iter__(self) -> Iterator[str]:
        return iter(("loss",))

    def __len__(self) -> int:
        return 1
