"""float16 mixed precision: dynamic loss scaling, as ``torch.amp.GradScaler`` does it.

Under ``amp="fp16"`` the forward runs in float16, whose smallest normal number is 6e-5: the
gradients of small activations round to zero on the way back, and the weights they should
move stop training, silently. So the loss is scaled before backward: each shard's loss
sum is multiplied by ``factor(n)``, the scale over the step's global number of samples ``n``
(the gradients are then those of the batch's mean times the scale, as GradScaler's are), and
the summed gradient is divided by that factor together with the global denominator (one
multiplication, ``scaled_denominator``). A step whose gradients overflowed (inf or NaN
on any device or process: a scale too large) updates nothing and halves the scale; after
``interval`` steps in a row without, the scale doubles. The defaults are GradScaler's
(65536, x2, x0.5, 2000), so a run takes the steps the plain loop with a GradScaler takes
(tested). bfloat16 has float32's range and needs none of this.

A skipped step is not a NaN batch: its loss is counted and the run goes on (``StepResult.overflow``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Union

import torch

from ..parallel.sync.base import Denominator


class LossScale:
    """The scale and its rule (see the module docstring).

    >>> scale = LossScale()
    >>> k = scale.factor(n); (loss_sum * k).backward()
    >>> stepped = trainer.step(scale.scaled_denominator(n, k), skip_nonfinite=True); scale.update(stepped)
    """

    def __init__(self, init: float = 65536.0, growth: float = 2.0, backoff: float = 0.5, interval: int = 2000):
        self.scale, self.growth, self.backoff, self.interval = float(init), growth, backoff, interval
        self.good = 0          # steps in a row without an overflow

    def factor(self, samples: int, per_sample: float = 1.0) -> float:
        """What a step's loss sums are multiplied by before backward: the scale over the
        step's global number of samples (the same on every device and process), times
        ``per_sample``, what the loss's mean counts per sample: the target's elements for an
        element-wise mean (``MSELoss``), so its gradients are GradScaler's, not that many
        times larger (which cost a few skipped steps while the scale settled)."""
        return self.scale / max(samples * per_sample, 1)

    def scaled_denominator(self, denominator: Union[Denominator, Callable[[], Denominator]], factor: float):
        """What to divide the summed gradient of loss sums times ``factor`` by: the
        denominator times it (a sum loss's None: the factor alone; a function: one that
        multiplies what it gives)."""
        if callable(denominator):
            return lambda: self._times(denominator(), factor)
        return self._times(denominator, factor)

    @staticmethod
    def _times(denominator: Denominator, scale: float) -> Denominator:
        return scale if denominator is None else denominator * scale

    def after_step(self, stepped: bool, loss: torch.Tensor) -> bool:
        """``update``, and whether the step was an overflow: not stepped, and its ``loss``
        finite (not a NaN batch: it counts, and the run goes on)."""
        self.update(stepped)
        return not stepped and bool(torch.isfinite(loss))

    def update(self, stepped: bool) -> None:
        """After a step: halve the scale if its gradients overflowed (it did not step), or
        grow it after ``interval`` good steps in a row."""
        if not stepped:
            self.scale, self.good = self.scale * self.backoff, 0
            return
        self.good += 1
        if self.good == self.interval:
            self.scale, self.good = self.scale * self.growth, 0

    def state_dict(self) -> Dict[str, Any]:
        return {"scale": self.scale, "good": self.good}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.scale, self.good = float(state["scale"]), int(state["good"])

