"""An epoch's training loss: its sum and denominator over the steps, and each step's verdict.

On CPU devices a step's numbers are read at once: reading a 0-d tensor costs 0.1 us there,
testing it for NaN as a tensor 4 us, adding it to a tensor 1.5 us (issue 22: the tiny MLP's
step is 150 us). On GPUs they stay on the device, added there, and the loop reads each
step's verdict one step late (``loop.py``), so the host never waits for the device.

>>> tally = Tally(torch.device("cpu"), on_host=True)
>>> verdict = tally.add(result)          # after each step that updated
>>> Tally.finite(verdict)                # was its loss finite?
>>> tally.loss_sum, tally.count          # the epoch's so far
"""
from __future__ import annotations

import math
from typing import Any, Union

import torch

from ..engine.losses import add_counts
from ..engine.step_plan import StepResult


class Tally:
    """See the module docstring. ``loss_sum`` and ``count`` are numbers (on the host) or a
    0-d float64 tensor and a count (on the device)."""

    def __init__(self, device: torch.device, on_host: bool):
        self.on_host = on_host
        self.loss_sum: Union[float, torch.Tensor] = 0.0 if on_host else \
            torch.zeros((), dtype=torch.float64, device=device)
        self.count: Any = 0

    def add(self, result: StepResult) -> Union[float, torch.Tensor]:
        """Count a step that updated; return what tells whether its loss was finite."""
        if self.on_host:
            value, count = result.numbers()
            self.loss_sum += value
            self.count += count
            return value
        total = result.loss_sum()
        self.loss_sum += total
        self.count = add_counts(self.count, result.count)
        return total

    def numbers(self) -> tuple:
        """``(loss sum, count)`` so far, as numbers (waits for the device)."""
        return float(self.loss_sum), float(self.count)

    @staticmethod
    def finite(verdict: Union[float, torch.Tensor]) -> bool:
        if isinstance(verdict, float):
            return math.isfinite(verdict)
        return bool(torch.isfinite(verdict))
