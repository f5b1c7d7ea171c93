"""An epoch's training loss: its sum and denominator over the steps, and each step's verdict
(was its loss finite?), for as little host time per step as can be.

On CPU devices a step's loss is read at once: reading a 0-d tensor costs 0.1 us there,
testing it for NaN as a tensor 4 us, adding it to a tensor 1.5 us (issue 22: the tiny MLP's
step is 150 us). On GPUs the sums stay on the device, and the verdicts are read in groups:
every ``group`` steps one ``Snapshot`` copies "is the epoch's sum still finite?" to the host
without waiting, and the loop reads it ``group`` steps later (``loop.py``'s run-ahead), when
the device is long past it. Reading one GPU number otherwise waits for everything queued
after it too, and a few kernels a step cost a small model's step 20-40% (issue 22, H100).
A classification step's denominator (``LazyCount``) is computed for many steps at once.

>>> tally = Tally(torch.device("cpu"), on_host=True)
>>> verdict = tally.add(result)          # after each step that updated
>>> Tally.finite(verdict)                # was its loss finite?
>>> tally.numbers()                      # the epoch's (loss sum, count) so far
>>> tally.figure_totals([])              # and its train_metrics sums (TrainFigures)
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple, Union

import torch

from ..engine.class_counts import LazyCount, class_counts
from ..engine.losses import add_counts
from ..engine.step_plan import StepResult


class Tally:
    """See the module docstring. ``on_host``: read every step's loss at once (CPU devices
    with no run-ahead); ``group``: steps per snapshot on a GPU."""

    def __init__(self, device: torch.device, on_host: bool, group: int = 1, figures: Optional[Any] = None,
                 resumed_at: int = 0):
        self.device, self.on_host, self.group = device, on_host, max(1, group)
        self.figures = figures          # the engine's TrainFigures (train_metrics), from zero
        if figures is not None:
            figures.reset(partial=resumed_at > 0)   # (the metric objects' state was not saved)
        self._sum: Union[float, torch.Tensor] = 0.0 if on_host else \
            torch.zeros((), dtype=torch.float64, device=device)
        self._count: Any = 0
        self._lazy: List[Tuple[torch.Tensor, LazyCount]] = []
        self._snapshot: Optional[Snapshot] = None
        self._in_group = 0

    def add(self, result: StepResult) -> Any:
        """Count a step that updated; return its verdict (see ``finite``)."""
        loss, count = result.loss, result.count
        read = None
        if isinstance(count, LazyCount):
            self._lazy.append((loss, count))
            if len(self._lazy) >= 64:
                self._fold()
        elif self.on_host:
            read, number = loss.item(), float(count)
            self._sum += read * number if result.mean else read
            self._count += number
        else:
            if not result.mean:
                self._sum += loss
            elif isinstance(count, torch.Tensor):
                self._sum.addcmul_(loss, count)
            else:
                self._sum.add_(loss, alpha=count)
            self._count = add_counts(self._count, count)
        # The loss is finite exactly when its sum is (a mean over no sample is NaN).
        if self.on_host:
            return loss.item() if read is None else read
        if loss.device.type != "cuda":
            return loss
        if self._snapshot is None:
            self._snapshot = Snapshot(self)
        verdict = (self._snapshot, loss)
        self._in_group += 1
        if self._in_group >= self.group:
            self.close_group()
        return verdict

    def close_group(self) -> None:
        """Take the current group's snapshot now (its verdicts are asked for)."""
        if self._snapshot is not None:
            self._fold()
            self._snapshot.record(self._sum)
            self._snapshot, self._in_group = None, 0

    def _fold(self) -> None:
        if not self._lazy:
            return
        losses, counts = zip(*self._lazy)
        self._lazy = []
        n = class_counts(counts)
        values = torch.stack([v.to(n.device) for v in losses]).to(torch.float64)
        if self.on_host:
            self._sum += float((values * n).sum())
            self._count += float(n.sum())
        else:
            self._sum += (values * n).sum().to(self.device)
            self._count = add_counts(self._count, n.sum().to(self.device))

    def numbers(self) -> Tuple[float, float]:
        """``(loss sum, count)`` so far, as numbers (waits for the device)."""
        self._fold()
        return float(self._sum), float(self._count)

    def totals(self) -> Tuple[Any, Any]:
        """``(loss sum, count)`` so far, left where they are (no wait)."""
        self._fold()
        return self._sum, self._count

    def figure_numbers(self, before: List[float]) -> List[float]:
        """The training figures' sums so far (``train_metrics``; none without), added to
        ``before`` (a resumed epoch's), as numbers (waits for the device)."""
        if self.figures is None:
            return []
        return [b + n for b, n in zip(before or [0.0] * len(self.figures.keys), self.figures.numbers())]

    def figure_totals(self, before: List[float]) -> List[torch.Tensor]:
        """``figure_numbers``, left where they are (float64 0-d tensors; no wait)."""
        if self.figures is None:
            return []
        totals = self.figures.totals()
        return [totals[k] + b for k, b in zip(self.figures.keys, before or [0.0] * len(self.figures.keys))]

    @staticmethod
    def finite(verdict: Any) -> bool:
        """Whether the step's loss was finite: a number (CPU), a tensor, or a GPU step's
        ``(snapshot, loss)`` (its loss is read only if the snapshot is not clean)."""
        if isinstance(verdict, float):
            return math.isfinite(verdict)
        if isinstance(verdict, tuple):
            snapshot, loss = verdict
            return snapshot.clean() or bool(torch.isfinite(loss))
        return bool(torch.isfinite(verdict))


class Snapshot:
    """Whether an epoch's GPU loss sum was finite after a group of steps, copied to the host
    as the group ends, without waiting; ``clean`` waits for that group's end only."""

    def __init__(self, tally: Tally):
        self.tally = tally
        self.flag: Optional[torch.Tensor] = None
        self.done: Optional[Any] = None

    def record(self, total: torch.Tensor) -> None:
        self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
        self.flag.copy_(torch.isfinite(total), non_blocking=True)
        self.done = torch.cuda.Event()
        self.done.record()

    def clean(self) -> bool:
        if self.flag is None:       # asked before its group ended (the epoch's end, a save)
            self.tally.close_group()
        self.done.synchronize()
        return bool(self.flag)
