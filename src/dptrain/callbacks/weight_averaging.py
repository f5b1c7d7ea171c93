"""Lightning's ``EMAWeightAveraging`` as ``fit`` runs it: dptrain's ``EMA`` with Lightning's rules.

    dptrain.fit(lit_model, dm, callbacks=[EMAWeightAveraging(decay=0.99)])   # as to Lightning's Trainer

Lightning keeps a ``torch.optim.swa_utils.AveragedModel`` of the module (its parameters and
buffers): its first update, after the first update of training it should take, copies the
weights; each later one is ``decay * average + (1 - decay) * weights``. It updates after each
optimizer step whose index (from 0) is at least ``update_starting_at_step`` and a multiple of
``update_every_n_steps``, and after each epoch from ``update_starting_at_epoch`` on (if given);
every evaluation runs on the average, and when training ends the model holds it. ``LightningEMA``
does the same on ``EMA``'s protocol (``training.py``: the average on the model's device in every
process, in checkpoints): one integer buffer differs, a BatchNorm's ``num_batches_tracked``,
which Lightning's average moves by ``decay`` (truncated, so it lags) and this copies.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .base import BatchEnd, Row
from .training import EMA


class LightningEMA(EMA):
    """``EMA(decay, evaluate=True)`` updated as Lightning's ``EMAWeightAveraging`` (see the module
    docstring), the average in the model at the end of ``fit``."""

    def __init__(self, decay: float = 0.999, update_every_n_steps: int = 1,
                 update_starting_at_step: Optional[int] = None, update_starting_at_epoch: Optional[int] = None):
        super().__init__(decay, evaluate=True)
        self.every, self.from_step, self.from_epoch = update_every_n_steps, update_starting_at_step, \
            update_starting_at_epoch
        self.averaged = 0           # (AveragedModel's n_averaged: its first update copies)

    def _due(self, step: Optional[int] = None, epoch: Optional[int] = None) -> bool:
        """Lightning's ``EMAWeightAveraging.should_update`` (``step``, ``epoch``: indices from 0)."""
        if step is not None and (self.from_step is None or step >= self.from_step) and \
                self.every > 0 and step % self.every == 0:
            return True
        return epoch is not None and self.from_epoch is not None and epoch >= self.from_epoch

    @torch.no_grad()
    def _update(self, run: Any) -> None:
        for name, value in run.model.state_dict().items():
            average = self.weights[name]
            if self.averaged == 0 or not average.is_floating_point():
                average.copy_(value)
            else:
                average.mul_(self.decay).add_(value.detach(), alpha=1.0 - self.decay)
        self.averaged += 1
        self.updates += 1

    def on_batch_end(self, run: Any, batch: BatchEnd) -> None:
        if batch.result.stepped and self._due(step=batch.step - 1):
            self._update(run)

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        if self._due(epoch=epoch - 1):
            self._update(run)

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        run.load_weights(self.weights)          # (Lightning's on_train_end: the average into the model)

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "averaged": self.averaged}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.averaged = state.get("averaged", self.updates)
