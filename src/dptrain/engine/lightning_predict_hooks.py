"""``dptrain.predict`` of a LightningModule: its own hooks of the predict run, where Lightning's
``trainer.predict`` calls them:

    def on_predict_batch_end(self, outputs, batch, batch_idx):
        self.written.append(outputs.argmax(1))              # a BasePredictionWriter's habit

    def on_predict_epoch_end(self):
        torch.save(torch.cat(self.written), "predictions.pt")

``on_predict_start`` and ``on_predict_epoch_start`` before the first batch, once a process, on
the module; ``on_predict_batch_start(batch, batch_idx)`` and ``on_predict_batch_end(outputs,
batch, batch_idx)`` around each device's ``predict_step`` (or forward pass) on its copy of the
module, with its part of the batch and that part's outputs, as Lightning's DDP calls them on each
rank (``lightning_eval_batch.EvalBatchHooks``); ``on_predict_epoch_end`` and ``on_predict_end``
after the last batch, once a process, on the module, what every device's copy appended to the
module's lists put together first in the batches' order (``kept_outputs.py``, as ``fit`` does
before ``on_validation_epoch_end``). ``predict`` returns the outputs all the same.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

from .kept_outputs import KeptOutputs
from .lightning_eval_batch import EvalBatchHooks

#: The hooks of the predict run around its batches (the batch hooks: ``lightning_eval_batch.AROUND``).
RUN_HOOKS = ("on_predict_start", "on_predict_epoch_start", "on_predict_epoch_end", "on_predict_end")


class PredictHooks:
    """The module's own hooks of the predict run (those it overrides), on ``replicas`` (the first
    the module) on ``device``: ``start`` before the batches, ``around`` each device's call on its
    part, ``end`` after them."""

    def __init__(self, model: nn.Module, replicas: Sequence[nn.Module], device: torch.device):
        from .lightning_module import overridden        # (lightning_module makes its steps with this)
        self.model, self.own = model, set(overridden(model, RUN_HOOKS))
        self.batch = EvalBatchHooks(model, "predict_step")
        self.kept = KeptOutputs(replicas, device) if len(replicas) > 1 and "on_predict_epoch_end" in self.own \
            else None

    def __bool__(self) -> bool:
        return bool(self.own or self.batch)

    def _call(self, *hooks: str) -> None:
        for hook in hooks:
            if hook in self.own:
                getattr(self.model, hook)()

    def start(self) -> None:
        self._call("on_predict_start", "on_predict_epoch_start")

    def around(self, replica: nn.Module, part: Any, index: int, call: Callable[[], Any]) -> Any:
        """``call()`` (the device's step on its ``part`` of batch ``index``) between the batch hooks."""
        if self.kept is not None:
            self.kept.count(replica)
        return self.batch.around(replica, part, index, call) if self.batch else call()

    def end(self) -> None:
        if self.kept is not None:
            self.kept.gather(set())
        self._call("on_predict_epoch_end", "on_predict_end")
