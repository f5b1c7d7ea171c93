"""A LightningModule's own hooks of each evaluation batch: ``on_validation_batch_start(batch,
batch_idx)`` before ``validation_step`` and ``on_validation_batch_end(outputs, batch, batch_idx)``
after it (``on_test_batch_*`` around ``test_step`` in ``dptrain.evaluate``, as Lightning's
``trainer.test`` calls them), ``outputs`` what the step returned:

    def on_validation_batch_end(self, outputs, batch, batch_idx):
        self.val_probs.append(outputs["probs"])            # read by on_validation_epoch_end
        self.log("val_conf", outputs["probs"].max(1).values.mean())

They run where the step runs, as Lightning's DDP runs them on each rank: on each device's copy
of the module, with that device's part of the batch and that part's outputs, right after its
step. So what they give ``self.log`` is kept as the step's own (the mean over the whole set,
every device's and process's parts weighed by their samples: Lightning's ``on_epoch`` default
in these hooks), what they append to the module's lists is put together in the batches' order
for ``on_validation_epoch_end`` (``kept_outputs.py``), and a metric object they update is merged
over the devices' copies, as the step's are. ``batch_idx`` is the batch's index in the
evaluation (every device's part has the same).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from torch import nn

#: The hooks around each step method's batch, by the step Lightning calls between them.
AROUND = {"validation_step": ("on_validation_batch_start", "on_validation_batch_end"),
          "test_step": ("on_test_batch_start", "on_test_batch_end")}


class EvalBatchHooks:
    """The module's own hooks around ``step`` (``validation_step`` or ``test_step``) that it
    overrides; ``around(replica, batch, index, call)`` runs ``call()`` (the step) between them,
    on the replica, and gives back what the step returned."""

    def __init__(self, model: nn.Module, step: str):
        from .lightning_module import overridden        # (lightning_module makes its steps with this)
        start, end = AROUND.get(step, (None, None))
        own = set(overridden(model, [h for h in (start, end) if h is not None]))
        self.start: Optional[Callable[..., Any]] = getattr(type(model), start) if start in own else None
        self.end: Optional[Callable[..., Any]] = getattr(type(model), end) if end in own else None
        self.names: Tuple[str, ...] = tuple(h for h in (start, end) if h in own)

    def __bool__(self) -> bool:
        return bool(self.names)

    def around(self, replica: nn.Module, batch: Any, index: int, call: Callable[[], Any]) -> Any:
        if self.start is not None:
            self.start.__get__(replica)(batch, index)
        out = call()
        if self.end is not None:
            self.end.__get__(replica)(out, batch, index)
        return out
