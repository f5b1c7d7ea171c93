"""dptrain's own outputs, as callbacks on the same protocol a user's callback has.

``Run`` puts the progress bar first in the list (its line is cleared before anything is
printed), then the user's callbacks, then ``OwnFigures`` and the writers: the epoch lines,
the metrics file, TensorBoard and the trace. So a figure a callback adds to an epoch's row
in ``on_epoch_end`` (``row["weight_norm"] = ...``, as a Keras callback adds to ``logs``) is
in the line, the history, the metrics file and TensorBoard; one added to a step's row in
``on_train_log`` is in its line, ``step_history`` and TensorBoard (``step/<name>``). Each
writes from rank 0 only (the trace gathers every rank's events first).
"""
from __future__ import annotations

import json
import numbers
from typing import Any, Dict, Optional

import numpy as np
import torch

from ..data.batch import holds_images
from ..outputs.metrics_file import MetricsLog
from ..outputs.progress import ProgressBar as Bar, seconds
from ..outputs.tensorboard import TensorBoardLog, step_figures
from ..outputs.trace import Window
from .base import BatchEnd, Callback, Row


def plain(key: str, value: Any, where: str = "epoch") -> Any:
    """A row's value as the outputs and checkpoints hold it: a one-element tensor or a NumPy
    number becomes a Python number, a larger tensor or array a list; anything JSON cannot
    hold is an error naming the key (of the ``where`` row)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, bool, numbers.Number)):
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise TypeError(f"the {where} row's {key!r} is a {type(value).__name__}, which the history, the metrics file "
                        f"and checkpoints cannot hold: give a number (or a list, a string)") from None
    return value


class OwnFigures(Callback):
    """After the user's callbacks: what they added to an epoch's or a step's row made plain
    (``plain``)."""

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        _made_plain(row, "epoch")

    def on_train_log(self, run: Any, row: Row) -> None:
        _made_plain(row, "step")


def _made_plain(row: Row, where: str) -> None:
    for key, value in row.items():
        if not isinstance(value, (float, int, str)):
            row[key] = plain(key, value, where)


def said(key: str, value: float) -> str:
    """A figure as a line gives it: ``train loss 0.512``; a learning rate (``lr``, several
    optimizers' ``lr_<name>``) to 3 significant figures, a whole number (a callback's count) whole."""
    if isinstance(value, int):
        return f"{key.replace('_', ' ')} {value}"
    return f"{key.replace('_', ' ')} {value:.3g}" if key == "lr" or key.startswith("lr_") else \
        f"{key.replace('_', ' ')} {value:.3f}"


class EpochLog(Callback):
    """``epoch 3, 7.9 sec, train loss 0.512, test loss 0.498, test acc 0.822`` after each epoch."""

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        # (a LightningModule stepping its own optimizers whose training_step returns nothing: no train loss to say)
        unsaid = getattr(getattr(run, "task", None), "manual", False) and row.get("train_loss") != row.get("train_loss")
        line = f"epoch {row['epoch']}, {seconds(row['sec'])} sec, " + ", ".join(
            said(k, v) for k, v in row.items()
            if k not in ("epoch", "sec", "skipped", "split", "batches", "samples") and isinstance(v, (int, float))
            and not (unsaid and k == "train_loss"))
        if "split" in row:
            line += f", split {'/'.join(map(str, row['split']))}"
        cut = getattr(run, "cut", None)
        if "batches" in row and (cut is not None or run.batches is not None):    # max_steps or max_time ended it
            of = f" of {run.batches}" if run.batches else ""
            line += f", {row['batches']}{of} batches ({cut.cause if cut is not None else 'max_steps'})"
        elif "batches" in row:              # an open-ended stream's epoch: the batches it yielded
            line += f", {row['batches']} batches"
        if row.get("skipped"):
            line += f", {row['skipped']} of {row.get('batches', run.batches)} batches skipped (loss not finite)"
        run.log(line)

    def on_train_log(self, run: Any, row: Row) -> None:
        figures = "".join(f", {said(k, v)}" for k, v in step_figures(row).items()
                          if "/" not in k)     # each parameter's (grad_norm/<name>): too many for a line
        run.log(f"step {row['step']} (epoch {row['epoch']}, batch {row['batch']}){figures}")


class ProgressBar(Callback):
    """The in-place bar of an epoch on a terminal (rank 0; nothing when not a terminal)."""

    def __init__(self) -> None:
        self.bar: Optional[Bar] = None
        self.samples = 0

    unit = "samples/s"

    def on_fit_start(self, run: Any) -> None:
        if holds_images(run.train_loader.example()):
            self.unit = "img/s"

    def on_epoch_start(self, run: Any, epoch: int) -> None:
        self.bar, self.samples = Bar(run.batches, epoch, enabled=run.is_main, unit=self.unit), 0

    def on_batch_end(self, run: Any, batch: BatchEnd) -> None:
        self.samples += batch.samples
        if self.bar is not None and self.bar.due(batch.batch):     # the loss is read (a wait) only then
            self.bar.update(batch.batch, self.samples, batch.epoch_loss)

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        self.on_exception(run, None)

    def on_evaluate_end(self, run: Any, epoch: int, metrics: Dict[str, float]) -> None:
        self.on_exception(run, None)        # cleared before the epoch's line

    def on_train_log(self, run: Any, row: Row) -> None:
        if self.bar is not None:            # cleared before the step's line; drawn again after it
            self.bar.close()

    def on_exception(self, run: Any, error: Optional[BaseException]) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class MetricsFile(Callback):
    """``--metrics FILE.jsonl``: one record per epoch, on disk when the epoch ends; a resumed
    run starts the file again from the checkpoint's history."""

    def __init__(self, path: str) -> None:
        self.path, self.log = path, None

    def on_fit_start(self, run: Any) -> None:
        if run.is_main:
            self.log = MetricsLog(self.path, [run.record(row) for row in run.history])

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        if self.log is not None:
            self.log.append(run.record(row))


class TensorBoard(Callback):
    """``--tensorboard DIR``: the epoch records as TensorBoard scalars (rank 0)."""

    def __init__(self, directory: str, fresh: bool = False, rank: int = 0) -> None:
        # Opened now, so a missing tensorboard package is said before any training.
        self.board = TensorBoardLog(directory, fresh=fresh) if rank == 0 else None
        self.directory = directory

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        if self.board is not None:
            self.board.append(run.record(row))

    def on_train_log(self, run: Any, row: Row) -> None:
        if self.board is not None:
            self.board.append_step(row)


class Trace(Callback):
    """``--trace FILE.json``: a Chrome trace of ``steps`` steps from step ``from_step``."""

    def __init__(self, path: str, steps: int = 10, from_step: int = 3) -> None:
        self.path, self.steps, self.from_step = path, steps, from_step
        self.window: Optional[Window] = None

    def on_fit_start(self, run: Any) -> None:
        total = run.epochs * run.batches if run.batches is not None else None
        self.window = Window(self.path, self.steps, total, run.rank, run.device_names,
                             run.collective, run.log, from_step=self.from_step)

    def on_batch_start(self, run: Any, epoch: int, batch: int) -> None:
        self.window.step(run.step)

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        self.window.finish()            # the run was shorter than the trace
