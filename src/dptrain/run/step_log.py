"""``log_every_n_steps=N``: every N updates, the training loss over them, for curves finer
than an epoch (Lightning's ``log_every_n_steps``, Hugging Face's ``logging_steps``); and
``eval_every_n_steps=M``: an evaluation every M updates, mid-epoch too (Hugging Face's
``eval_steps``, Lightning's ``val_check_interval``), its ``test_*`` figures in that step's row.
Each of ``run.step_evaluation_hooks`` is told before and after each such evaluation (a
LightningModule's ``on_validation_epoch_start`` and ``on_validation_epoch_end``, as Lightning
calls them around each validation: what the latter logs joins the row's figures).

A row is ``{step, epoch, batch, steps, train_loss, lr}`` (and ``grad_norm``, with
``log_grad_norm``: the update's before it, as Hugging Face logs it; with
``log_grad_norm="parameters"`` also ``grad_norm/<name>``, each trainable parameter's part of
it, as Lightning's ``grad_norm(module)`` names them, left out of the line; several optimizers:
``grad_norm_<name>``, each update's): the loss over the ``steps``
updates since the last such row (whole windows across epoch boundaries), summed over every device
and process as the epoch's loss is (one ``all_reduce`` of two numbers a row), and the first
group's learning rate (several optimizers: each update's loss too, ``train_<name>_loss``, and
each one's ``lr_<name>``). Rows go to the callbacks' ``on_train_log``, the epoch lines,
TensorBoard (``step/train_loss``, ``step/lr``, at the step) and the result's
``step_history``; checkpoints keep them, with the loss sums of the window the checkpoint
cut (summed over the processes), so a resumed run's rows equal the unbroken run's (a
checkpoint of an older version has none: its first row covers the updates since the
checkpoint, and ``steps`` says how many).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import torch

from .report import figures_over, lr_figures, other_sets


class StepLog:
    """The training-loss windows and the rows (see the module docstring; the loop decides at
    which steps rows are due); ``rows``: the history. ``updates``: several optimizers' names:
    each one's loss is windowed too (``train_<name>_loss``), and ``train_loss`` is their sum.
    A window is a list of sums: the loss and its count, then each update's loss and count."""

    def __init__(self, collective: Any, updates: Sequence[str] = ()):
        self.collective, self.updates = collective, list(updates)
        self.width = 2 + 2 * len(self.updates)
        self.rows: List[Dict[str, Any]] = []
        self.carried = [0.0] * self.width       # the window's sums from the epochs before (their tails)
        self.last = [0.0] * self.width          # the epoch's sums at the last row
        self.last_step = 0
        self.tally: Any = None                  # the epoch's sums now: read(tally)
        self.restored = False

    def read(self, tally: Any) -> List[float]:
        """The epoch's sums so far in ``tally`` (several optimizers: their training figures'
        too, which are then each update's loss and count, in order)."""
        sums = list(tally.numbers())
        return sums + tally.figure_numbers([]) if self.updates else sums

    def _open(self, now: Sequence[float]) -> List[float]:
        return [c + n - l for c, n, l in zip(self.carried, now, self.last)]

    def start(self, step: int) -> None:
        """Where the run (re)starts: windows count from there (from the last row before a
        checkpoint, for a run resumed from one that kept its window: ``restore``)."""
        if not self.restored:
            self.last_step = step

    def epoch_start(self, tally: Any) -> None:
        """An epoch begins; ``tally`` holds its sums (``read`` them when asked)."""
        self.last, self.tally = [0.0] * self.width, tally

    def epoch_end(self, tally: Any) -> None:
        """The epoch's end: the tail since the last row carries over."""
        now = self.read(tally)
        self.carried, self.last = self._open(now), now

    def state_dict(self) -> Dict[str, Any]:
        """For a checkpoint (every process calls it, at the same point): the open window's
        sums over every process, and the step of the last row."""
        now = self.read(self.tally) if self.tally is not None else self.last
        window = self.collective.all_reduce(torch.tensor(self._open(now), dtype=torch.float64)).tolist()
        return {"window": window, "last_step": self.last_step}

    def restore(self, state: Optional[Dict[str, Any]], rank: int) -> None:
        """Go on with a checkpoint's open window (``state_dict``): rank 0 carries its sums."""
        if state:
            window = (list(state["window"]) + [0.0] * self.width)[:self.width]
            self.carried = window if rank == 0 else [0.0] * self.width
            self.last_step, self.restored = int(state["last_step"]), True

    def row(self, sums: Optional[Sequence[float]], step: int, epoch: int, batch: int, lr: Dict[str, float],
            tested: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The row after update ``step``: with ``sums``, the epoch's so far (``read``: a
        ``log_every_n_steps`` step), the training loss since the last such row; with
        ``tested``, the ``test_*`` figures of an evaluation made then (``eval_every_n_steps``).
        Every process calls it at the same steps."""
        row: Dict[str, Any] = {"step": step, "epoch": epoch, "batch": batch}
        if sums is not None:
            window, self.carried, self.last = self._open(sums), [0.0] * self.width, list(sums)
            total = self.collective.all_reduce(torch.tensor(window, dtype=torch.float64)).tolist()
            row.update(steps=step - self.last_step, train_loss=_ratio(total[0], total[1]))
            if self.updates:
                each = {f"train_{name}_loss": _ratio(total[2 + 2 * k], total[3 + 2 * k])
                        for k, name in enumerate(self.updates)}
                row.update(train_loss=sum(each.values()), **each)
            self.last_step = step
        row.update(lr)                  # {"lr": ...} (report.lr_figures)
        row.update(tested or {})
        self.rows.append(row)
        return row


def _ratio(total: float, count: float) -> float:
    return total / count if count else math.nan


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
        for hooks in run.step_evaluation_hooks:      # (a LightningModule's on_validation_epoch_start)
            hooks.before_step_evaluation(run)
        evals = run.engine.evaluate(run.eval_loader)
        figures = figures_over(run.engine, run.eval_loader, run.collective, evals)
        others = other_sets(run.engine, run.other_evals, run.collective)
        run._step_evals = (run.step, evals, others)
        figures.update(others)
        for hooks in run.step_evaluation_hooks:      # (... its on_validation_epoch_end: what it logs, in the row)
            hooks.after_step_evaluation(run, figures)
    row = run.step_log.row(run.step_log.read(tally) if logged else None, run.step, epoch, batch,
                           lr_figures(run.engine.trainer), figures)
    if logged and run.config.log_grad_norm and result is not None and result.stepped \
            and result.grad_norm is not None:
        norm = result.grad_norm     # several optimizers: each update's, grad_norm_<name>
        row.update({f"grad_norm_{name}": float(n) for name, n in norm.items()} if isinstance(norm, dict)
                   else {"grad_norm": float(norm)})
        row.update({f"grad_norm/{name}": norm for name, norm in run.engine.trainer.grad_norms().items()})
    if tested and run.schedule.after_step_evaluation(row):
        row.update(lr_figures(run.engine.trainer))        # what the next update uses
    run.callbacks.on_train_log(run, row)
    if run.watch_batches:
        run.edits.after("in on_train_log")
