"""``BestCheckpoint``: the weights of the best epochs by a figure, on disk (Keras's
``ModelCheckpoint(save_best_only=True)``, Lightning's ``ModelCheckpoint(save_top_k=k)``).

    BestCheckpoint("runs/best.pt", monitor="test_acc")                      # the best epoch's
    BestCheckpoint("runs/best-{epoch}.pt", monitor="test_loss", save_top_k=3)  # the 3 best
    BestCheckpoint("runs/e{epoch:02d}-{test_loss:.3f}.pt")                   # named by figures
    BestCheckpoint("runs/weights.{epoch:02d}-{val_loss:.2f}.pt")             # (Keras's names too)

Rank 0 writes each file atomically; the run's rows decide (the same on every process). The
files kept are in the callback's state, so a resumed run goes on keeping the same ones.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ..core.atomic import atomic_file
from .base import Callback, Row
from .monitor import Monitor, monitored_weights, peer_names
from .training import verbosity

Kept = Tuple[float, int, Optional[int], str]       # (value, epoch, step of a step evaluation, file)


class BestCheckpoint(Callback):
    """Keep the weights of the ``save_top_k`` best epochs by ``monitor`` (rank 0 writes,
    atomically): ``{"model": state_dict, "epoch", "monitor", "value"}``, loaded with
    ``dptrain.load_weights(Net(), path)`` or ``model.load_state_dict(torch.load(path)["model"])``.

    ``path`` may name the file by the epoch, the step and the row's figures (``str.format``:
    ``"best-{epoch}-{test_acc:.3f}.pt"``); with ``save_top_k`` > 1 it must hold ``{epoch}`` or
    ``{step}`` (``{step}`` with ``eval_every_n_steps``). A file that leaves the best ``save_top_k`` is
    deleted. ``best_path``: the best one's.

    It hears every evaluation of its ``test_*`` figure: each epoch's, and with
    ``eval_every_n_steps`` each of those (an epoch's evaluation of the weights a step
    evaluation at its last step scored already is not heard twice).

    A file already at ``path`` (any file the pattern matches) is refused (another run's best
    weights) unless the run resumes with this callback's state, or ``overwrite`` is true:
    this callback's own, else the run's (``fit(overwrite=True)``, ``--overwrite``).
    ``verbose`` (Keras's and Lightning's argument) says each file saved."""

    def __init__(self, path: str, monitor: str = "test_loss", mode: str = "auto", min_delta: float = 0.0,
                 overwrite: Optional[bool] = None, save_top_k: int = 1, verbose: Union[bool, int] = False):
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or not (save_top_k >= 1
                                                                                   or save_top_k == -1):
            raise ValueError(f"save_top_k must be a whole number >= 1 (or -1: every evaluation's), got {save_top_k!r}")
        self.template = str(path)
        if save_top_k != 1 and "{epoch" not in self.template and "{step" not in self.template:
            files = "a file for every evaluation" if save_top_k == -1 else f"{save_top_k} files"
            raise ValueError(f"save_top_k={save_top_k} keeps {files}: put {{epoch}} (or {{step}}) in the path, e.g. "
                             f"BestCheckpoint({str(Path(self.template).with_name('best-{epoch}.pt'))!r}, "
                             f"save_top_k={save_top_k})")
        self.path = Path(path)
        self.watch, self.overwrite = Monitor(monitor, mode, min_delta), overwrite
        self.save_top_k = save_top_k
        self.top_k = sys.maxsize if save_top_k == -1 else save_top_k      # (-1: Lightning's "every one")
        self.kept: List[Kept] = []          # the best first
        self.verbose = verbosity(verbose)

    def on_fit_start(self, run: Any) -> None:
        self.watch.check_start(run, f"BestCheckpoint({self.template!r})")
        if not run.is_main:
            return
        resumed = self.watch.best_epoch is not None or bool(self.kept)
        overwrite = run.config.overwrite if self.overwrite is None else self.overwrite
        there = self._existing()
        if there and not resumed and not overwrite:
            raise ValueError(f"{there[0]} already exists (another run's best weights?): pass overwrite=True "
                             f"(BestCheckpoint(..., overwrite=True), or fit's / --overwrite) to replace it, or "
                             f"give BestCheckpoint another path")
        if self.path.is_dir():
            raise ValueError(f"BestCheckpoint({self.template!r}) is a folder: give a file path")

    def _existing(self) -> List[Path]:
        pattern = Path(re.sub(r"\{[^{}]*\}", "*", self.template))
        return sorted(p for p in pattern.parent.glob(pattern.name) if p.is_file()) if pattern.parent.is_dir() else []

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.watch.mode == "min" else value > than

    def on_train_log(self, run: Any, row: Row) -> None:
        if self.watch.step_evaluation(row):
            if self.top_k > 1 and "{step" not in self.template:
                raise ValueError(f"BestCheckpoint({self.template!r}, save_top_k={self.save_top_k}) hears the "
                                 f"evaluations every eval_every_n_steps: name its files by the step too, e.g. "
                                 f"{self.template.replace('{epoch', '{step}-{epoch', 1)!r}")
            self._heard(run, row["epoch"], row, row["step"])

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        if self.watch.epoch_evaluation(run, row):
            self._heard(run, epoch, row, None)

    def _heard(self, run: Any, epoch: int, row: Row, step: Optional[int]) -> None:
        value = self.watch.value(row)
        news = self.watch.news()
        if news:
            run.log(f"BestCheckpoint: {news}")
        improved = self.watch.improved(epoch, row, step)
        keep = improved if self.top_k == 1 else not math.isnan(value) and (
            len(self.kept) < self.top_k or self._better(value, self.kept[-1][0]))
        if not keep:
            return
        path = self._name(epoch, step if step is not None else run.step, row)
        if run.is_main:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            weights = monitored_weights(run, self.watch.monitor)
            with atomic_file(Path(path)) as f:
                torch.save({"model": weights, "epoch": epoch, "step": step if step is not None else run.step,
                            "monitor": self.watch.monitor, "value": value}, f)
        if self.verbose:
            where = f"epoch {epoch}" if step is None else f"step {step}"
            run.log(f"BestCheckpoint: {self.watch.monitor} {value:.4g} at {where}, saved {path}")
        new: Kept = (value, epoch, step, path)
        ranked = [new] + self.kept if self.top_k == 1 else sorted(    # one: the newest best (min_delta's)
            self.kept + [new], key=lambda k: (k[0] if self.watch.mode == "min" else -k[0], k[1], k[2] or 0))
        self.kept = ranked[:self.top_k]
        for *_, old in ranked[self.top_k:]:
            if run.is_main and old not in {k[-1] for k in self.kept}:
                Path(old).unlink(missing_ok=True)

    def _name(self, epoch: int, step: int, row: Row) -> str:
        figures = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k not in ("epoch", "step")}
        peers = {peer: figures[ours] for peer, ours in peer_names(figures).items() if peer not in figures}
        try:
            return self.template.format(epoch=epoch, step=step, **figures, **peers)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"BestCheckpoint({self.template!r}): the path names {e} , which the epoch's row does "
                             f"not give; name it by {{epoch}} or by one of {', '.join(figures)}") from None

    @property
    def best_epoch(self) -> Optional[int]:
        return self.watch.best_epoch

    @property
    def best_path(self) -> Optional[str]:
        """The best kept epoch's file (None before one is kept)."""
        return self.kept[0][-1] if self.kept else None

    def state_dict(self) -> Dict[str, Any]:
        return {**self.watch.state_dict(), "kept": [list(k) for k in self.kept]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.watch.load_state_dict(state)
        kept = state.get("kept")
        if kept is None and state.get("best_epoch") is not None:       # a checkpoint of an older version
            kept = [[state["best"], state["best_epoch"], None, self.template]]
        self.kept = [(float(k[0]), int(k[1]), k[2] if len(k) == 4 else None, str(k[-1])) for k in kept or []]
