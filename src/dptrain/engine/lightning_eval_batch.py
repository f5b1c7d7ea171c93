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

Lightning ``Callback``s' hooks of the same names (``callbacks/lightning_callbacks.py`` sets
``LightningSteps.eval_callbacks``) run once a process, on the module, around the whole batch: its
``on_validation_batch_start(trainer, pl_module, batch, batch_idx)`` before any device's part,
``on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx)`` after every part and
the module's own hook (Lightning calls the callbacks' before the module's), ``batch`` this
process's as its loader gives it and ``outputs`` the parts' outputs put together as one device's
step would give them for the whole batch (``joined``): a per-sample tensor (a row a sample)
concatenated in the parts' order, a one-number float (tensor or number) taken as the part's mean
(a loss, an accuracy) and weighed by the parts' samples, a one-number integer as a count (the
correct predictions: summed), dicts, lists and tuples joined entry by entry; anything else must be
the same in every part (else a ``TypeError`` naming the fix). (A float sum over the part, a loss
with ``reduction="sum"``, is the one number this reads wrong: return it as a mean, or an integer.)
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn

#: The hooks around each step method's batch, by the step Lightning calls between them.
AROUND = {"validation_step": ("on_validation_batch_start", "on_validation_batch_end"),
          "test_step": ("on_test_batch_start", "on_test_batch_end"),
          "predict_step": ("on_predict_batch_start", "on_predict_batch_end")}     # (lightning_predict_hooks.py)


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


def joined(parts: Sequence[Any], sizes: Sequence[int]) -> Any:
    """The outputs of a batch's parts (of ``sizes`` samples, in order) as one step on the whole
    batch would give them (see the module's docstring); on the first part's device."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, torch.Tensor) and all(isinstance(p, torch.Tensor) for p in parts):
        if first.dim() == 0 and not first.is_floating_point():      # (a count: summed)
            return sum(p.detach().to(first.device) for p in parts)
        if first.dim() == 0:            # (a part's mean: weighed by its samples)
            total = sum(p.detach().to(first.device, torch.float64) * n for p, n in zip(parts, sizes))
            return (total / sum(sizes)).to(first.dtype)
        if all(p.dim() and len(p) == n for p, n in zip(parts, sizes)):
            return torch.cat([p.to(first.device) for p in parts])
    elif isinstance(first, Mapping) and all(isinstance(p, Mapping) and p.keys() == first.keys() for p in parts):
        return {k: joined([p[k] for p in parts], sizes) for k in first}
    elif isinstance(first, (list, tuple)) and all(type(p) is type(first) and len(p) == len(first) for p in parts):
        items = [joined([p[j] for p in parts], sizes) for j in range(len(first))]
        return items if isinstance(first, list) else tuple(items)
    elif isinstance(first, numbers.Integral) and not isinstance(first, bool) and \
            all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in parts):
        return sum(parts)               # (a count)
    elif isinstance(first, numbers.Real) and not isinstance(first, bool) and \
            all(isinstance(p, numbers.Real) and not isinstance(p, bool) for p in parts):
        return sum(p * n for p, n in zip(parts, sizes)) / sum(sizes)
    if all(_same(p, first) for p in parts[1:]):
        return first
    kinds = ", ".join(sorted({type(p).__name__ + (f" of shape {tuple(p.shape)}" if isinstance(p, torch.Tensor)
                                                    else "") for p in parts}))
    raise TypeError(f"a Lightning callback's on_validation_batch_end is given validation_step's outputs for this "
                    f"process's whole batch, put together from its devices' parts ({list(sizes)} samples), but "
                    f"these parts cannot be joined ({kinds}): return per-sample tensors (a row a sample), "
                    f"one-number means, or dicts and tuples of them; or train on one device")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except Exception:       # noqa: BLE001 - a comparison that fails: not the same
        return False


class EvalCallbacks:
    """Lightning callbacks' ``on_validation_batch_start/end`` around each evaluation batch:
    ``call(hook, *args)`` calls each callback's (``HookTargets.of_callbacks``); ``returned``, by the
    replica that gave it, each part's ``validation_step`` output (set as the step returns)."""

    def __init__(self, call: Callable[..., None], hooks: Sequence[str], clock: Any = None):
        self.call, self.hooks, self.clock = call, tuple(hooks), clock
        self.returned: dict = {}

    def start(self, batch: Any, index: int) -> None:
        self.returned.clear()
        if self.clock is not None:      # (its trainer's validating, before any part's step says it)
            self.clock.stage = "validate"       # (fit's evaluations alone take callbacks)
        if "on_validation_batch_start" in self.hooks:
            self.call("on_validation_batch_start", batch, index)

    def end(self, nets: List[nn.Module], sizes: Sequence[int], batch: Any, index: int) -> None:
        if "on_validation_batch_end" in self.hooks:
            outputs = joined([self.returned.get(id(net)) for net in nets], sizes)
            self.call("on_validation_batch_end", outputs, batch, index)
