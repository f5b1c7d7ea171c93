"""``log_every_n_steps=N``: every N updates, the training loss over them, for curves finer
than an epoch (Lightning's ``log_every_n_steps``, Hugging Face's ``logging_steps``).

A row is ``{step, epoch, batch, steps, train_loss, lr}``: the loss over the ``steps``
updates since the last row (whole windows across epoch boundaries), summed over every device
and process as the epoch's loss is (one ``all_reduce`` of two numbers a row), and the first
group's learning rate. Rows go to the callbacks' ``on_train_log``, the epoch lines,
TensorBoard (``step/train_loss``, ``step/lr``, at the step) and the result's
``step_history``; checkpoints keep them. A resumed run's first row covers the updates since
the checkpoint (``steps`` says how many).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import torch


class StepLog:
    """The windows of ``every`` updates (see the module docstring); ``rows``: the history."""

    def __init__(self, every: int, collective: Any, step: int = 0):
        self.every, self.collective = every, collective
        self.rows: List[Dict[str, Any]] = []
        self.carried = (0.0, 0.0)       # the window's sums from the epochs before (their tails)
        self.last = (0.0, 0.0)          # the epoch's sums at the last row
        self.last_step = step

    def start(self, step: int) -> None:
        """Where the run (re)starts: windows count from there."""
        self.last_step = step

    def epoch_start(self) -> None:
        self.last = (0.0, 0.0)

    def epoch_end(self, sums: Tuple[float, float]) -> None:
        """The epoch's ``(loss sum, count)`` at its end: the tail since the last row carries over."""
        self.carried = (self.carried[0] + sums[0] - self.last[0], self.carried[1] + sums[1] - self.last[1])

    def row(self, sums: Tuple[float, float], step: int, epoch: int, batch: int, lr: Any) -> Dict[str, Any]:
        """The row after update ``step`` from the epoch's ``(loss sum, count)`` so far (every
        process calls it at the same step)."""
        window = (self.carried[0] + sums[0] - self.last[0], self.carried[1] + sums[1] - self.last[1])
        self.last, self.carried = sums, (0.0, 0.0)
        total, count = self.collective.all_reduce(torch.tensor(window, dtype=torch.float64)).tolist()
        row = {"step": step, "epoch": epoch, "batch": batch, "steps": step - self.last_step,
               "train_loss": total / count if count else math.nan}
        if lr is not None:
            row["lr"] = lr
        self.last_step = step
        self.rows.append(row)
        return row
