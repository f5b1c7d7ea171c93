"""Each update's gradients, for the callbacks that ask (``Callback.on_gradients``).

A plain loop reads ``p.grad`` between ``loss.backward()`` and ``optimizer.step()``: a histogram
for TensorBoard, a per-layer norm, a check for NaN (Lightning's ``on_before_optimizer_step``).
Here no device holds that gradient whole in its ``p.grad``: on several devices each owner sums
its parameters' parts, with several processes the sum is made in buckets, and every update
divides it by the batch's denominator in place, clips it and lets it go. So a run whose callbacks
define ``on_gradients`` has its trainer keep a copy of each update's summed, divided gradient
before clipping (``Trainer.keep_grads``: one copy of the gradients an update, and only then),
and gives it to them after the update, by parameter name, on the model's device: the tensors
the plain loop's ``p.grad`` holds on the whole batch.

Told after the update, a callback cannot change it: a gradient written to is an error naming
the ways that do (a hook on the parameter, ``clip_grad_norm=``), not a change that silently
does nothing.
"""
from __future__ import annotations

from typing import Any

from ..callbacks.base import BatchEnd


def keep_for(run: Any) -> bool:
    """Have the run's trainer keep each update's gradients if a callback asks for them."""
    wanted = run.callbacks.wants("on_gradients")
    run.engine.trainer.keep_grads = wanted      # (an optimizer taking a closure refuses it: closure_step.py)
    return wanted


def tell(run: Any, end: BatchEnd) -> None:
    """Give the callbacks' ``on_gradients`` the update's gradients (none after a skipped one)."""
    grads = run.engine.trainer.take_grads()
    if not grads:
        return
    versions = [g._version for g in grads.values()]
    run.callbacks.on_gradients(run, end, grads)
    changed = [name for (name, g), v in zip(grads.items(), versions) if g._version != v]
    if changed:
        raise ValueError(f"a callback's on_gradients wrote to the gradient of {', '.join(map(repr, changed[:3]))}"
                         f"{' and others' if len(changed) > 3 else ''}, but it is told after the update, which "
                         f"that cannot change: change a gradient with a hook on its parameter "
                         f"(p.register_hook(lambda g: ...), every device's copy runs it), clip_grad_norm= or "
                         f"clip_grad_value=; to compute with one, copy it first (g.clone())")


