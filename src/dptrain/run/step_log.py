"""``log_every_n_steps=N``: every N updates, the training loss over them, for curves finer
than an epoch (Lightning's ``log_every_n_steps``, Hugging Face's ``logging_steps``); and
``eval_every_n_steps=M``: an evaluation every M updates, mid-epoch too (Hugging Face's
``eval_steps``, Lightning's ``val_check_interval``), its ``test_*`` figures in that step's row.

A row is ``{step, epoch, batch, steps, train_loss, lr}`` (and ``grad_norm``, with
``log_grad_norm``: the update's before it, as Hugging Face logs it; with
``log_grad_norm="parameters"`` also ``grad_norm/<name>``, each trainable parameter's part of
it, as Lightning's ``grad_norm(module)`` names them, left out of the line): the loss over the ``steps``
updates since the last such row (whole windows across epoch boundaries), summed over every device
and process as the epoch's loss is (one ``all_reduce`` of two numbers a row), and the first
group's learning rate. Rows go to the callbacks' ``on_train_log``, the epoch lines,
TensorBoard (``step/train_loss``, ``step/lr``, at the step) and the result's
``step_history``; checkpoints keep them, with the loss sums of the window the checkpoint
cut (summed over the processes), so a resumed run's rows equal the unbroken run's (a
checkpoint of an older version has none: its first row covers the updates since the
checkpoint, and ``steps`` says how many).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .report import figures_over, lr_figures, other_sets


class StepLog:
    """The training-loss windows and the rows (see the module docstring; the loop decides at
    which steps rows are due); ``rows``: the history."""

    def __init__(self, collective: Any):
        self.collective = collective
        self.rows: List[Dict[str, Any]] = []
        self.carried = (0.0, 0.0)       # the window's sums from the epochs before (their tails)
        self.last = (0.0, 0.0)          # the epoch's sums at the last row
        self.last_step = 0
        self.sums: Callable[[], Tuple[float, float]] = lambda: self.last     # the epoch's sums now
        self.restored = False

    def start(self, step: int) -> None:
        """Where the run (re)starts: windows count from there (from the last row before a
        checkpoint, for a run resumed from one that kept its window: ``restore``)."""
        if not self.restored:
            self.last_step = step

    def epoch_start(self, sums: Callable[[], Tuple[float, float]]) -> None:
        """An epoch begins; ``sums()`` gives its ``(loss sum, count)`` so far, when asked."""
        self.last, self.sums = (0.0, 0.0), sums

    def epoch_end(self, sums: Tuple[float, float]) -> None:
        """The epoch's ``(loss sum, count)`` at its end: the tail since the last row carries over."""
        self.carried = (self.carried[0] + sums[0] - self.last[0], self.carried[1] + sums[1] - self.last[1])
        self.last = sums

    def state_dict(self) -> Dict[str, Any]:
        """For a checkpoint (every process calls it, at the same point): the open window's
        loss sums over every process, and the step of the last row."""
        now = self.sums()
        open_window = (self.carried[0] + now[0] - self.last[0], self.carried[1] + now[1] - self.last[1])
        total, count = self.collective.all_reduce(torch.tensor(open_window, dtype=torch.float64)).tolist()
        return {"window": [total, count], "last_step": self.last_step}

    def restore(self, state: Optional[Dict[str, Any]], rank: int) -> None:
        """Go on with a checkpoint's open window (``state_dict``): rank 0 carries its sums."""
        if state:
            self.carried = tuple(state["window"]) if rank == 0 else (0.0, 0.0)
            self.last_step, self.restored = int(state["last_step"]), True

    def row(self, sums: Optional[Tuple[float, float]], step: int, epoch: int, batch: int, lr: Dict[str, float],
            tested: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The row after update ``step``: with ``sums``, the epoch's ``(loss sum, count)`` so
        far (a ``log_every_n_steps`` step), the training loss since the last such row; with
        ``tested``, the ``test_*`` figures of an evaluation made then (``eval_every_n_steps``).
        Every process calls it at the same steps."""
        row: Dict[str, Any] = {"step": step, "epoch": epoch, "batch": batch}
        if sums is not None:
            window = (self.carried[0] + sums[0] - self.last[0], self.carried[1] + sums[1] - self.last[1])
            self.last, self.carried = sums, (0.0, 0.0)
            total, count = self.collective.all_reduce(torch.tensor(window, dtype=torch.float64)).tolist()
            row.update(steps=step - self.last_step, train_loss=total / count if count else math.nan)
            self.last_step = step
        row.update(lr)                  # {"lr": ...} (report.lr_figures)
        row.update(tested or {})
        self.rows.append(row)
        return row


def log_step(run: Any, tally: Any, epoch: int, batch: int, result: Any = None) -> None:
    """The row due after update ``run.step``, if one is (``run.step_log`` is set): the loss
    window, with ``log_grad_norm`` the norm of that update's gradient (``result``'s; none
    when the update was skipped), an evaluation on the model's own weights (its sums kept in ``run._step_evals``:
    the epoch's evaluation of the same weights reuses them), a plateau scheduler stepped every
    batch deciding on it, and the callbacks' ``on_train_log``."""
    every, test_every = run.config.log_every_n_steps, run.config.eval_every_n_steps
    logged = bool(every) and run.step % every == 0
    tested = bool(test_every) and run.step % test_every == 0
    if not (logged or tested):
        return
    figures = None
    if tested:
        run._loaded = run._evaluated = None          # (run.evaluated_weights: the model's own)
        evals = run.engine.evaluate(run.eval_loader)
        figures = figures_over(run.engine, run.eval_loader, run.collective, evals)
        others = other_sets(run.engine, run.other_evals, run.collective)
        run._step_evals = (run.step, evals, others)
        figures.update(others)
    row = run.step_log.row(tally.numbers() if logged else None, run.step, epoch, batch,
                           lr_figures(run.engine.trainer), figures)
    if logged and run.config.log_grad_norm and result is not None and result.stepped \
            and result.grad_norm is not None:
        row["grad_norm"] = float(result.grad_norm)
        row.update({f"grad_norm/{name}": norm for name, norm in run.engine.trainer.grad_norms().items()})
    if tested and run.schedule.after_step_evaluation(row):
        row.update(lr_figures(run.engine.trainer))        # what the next update uses
    run.callbacks.on_train_log(run, row)
    if run.watch_batches:
        run.edits.after("in on_train_log")
