"""What watches a figure of the epoch rows for ``EarlyStopping`` and ``BestCheckpoint``:
``Monitor`` (the best value so far, by ``mode``), the mode a figure's name says
(``auto_mode``), Keras's and Lightning's names of the evaluation figures (``val_loss`` is
``test_loss`` here: ``peer_figure``), and the weights a figure describes (``monitored_weights``).

    watch = Monitor("val_accuracy")               # mode "max"; read at test_acc
    if watch.measured(run, row) and watch.improved(epoch, row): ...
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch

from .base import Row, overrides

Weights = Dict[str, torch.Tensor]


#: Words of a figure's name (its ``_``-separated parts start with them) that say which way is better.
LARGER_IS_BETTER = ("acc", "f1", "auc", "auroc", "score", "recall", "precision", "iou", "dice", "map", "r2", "bleu",
                    "rouge", "kappa", "mcc", "corr", "top", "sensitivity", "specificity")
SMALLER_IS_BETTER = ("loss", "error", "err", "mse", "mae", "rmse", "nll", "perplexity", "ppl", "wer", "cer",
                     "distance")


def auto_mode(monitor: str) -> str:
    """``"max"`` for a figure named as a score (``test_acc``, ``test_f1``, ``test_rare_recall``),
    ``"min"`` for one named as a loss or an error; a name that says neither is an error that
    asks for the mode (a silent guess could keep the worst weights)."""
    words = monitor.lower().split("_")
    larger = any(w.startswith(LARGER_IS_BETTER) for w in words)
    if larger != any(w.startswith(SMALLER_IS_BETTER) for w in words):
        return "max" if larger else "min"
    raise ValueError(f"mode='auto' cannot tell whether a larger {monitor} is better (its name says "
                     f"{'both' if larger else 'neither'}): give mode='max' or mode='min'")


#: Keras's names that are more than ``val_`` for ``test_`` (its ``metrics=["accuracy"]``).
SPELLED_OUT = {"val_accuracy": "test_acc"}


def peer_figure(monitor: str) -> str:
    """Our name for Keras's and Lightning's name of an evaluation figure: ``val_loss`` ->
    ``test_loss``, ``val_accuracy`` and ``val_acc`` -> ``test_acc``, ``val_f1`` -> ``test_f1``
    (the figures of ``eval_data``, the first set's, are ``test_*`` here); Hugging Face's,
    ``eval_loss`` -> ``test_loss``, ``eval_accuracy`` -> ``test_accuracy`` (its
    ``compute_metrics``' ``"accuracy"``); other names as they are."""
    if monitor.startswith("eval_"):
        return "test_" + monitor[len("eval_"):]
    if not monitor.startswith("val_"):
        return monitor
    return SPELLED_OUT.get(monitor, "test_" + monitor[len("val_"):])


def _whose(monitor: str) -> str:
    return "Hugging Face's name" if monitor.startswith("eval_") else "Keras's and Lightning's name"


def peer_names(figures: Row) -> Dict[str, str]:
    """Keras's, Lightning's and Hugging Face's names of the evaluation figures among ``figures``,
    each with ours (``{"val_loss": "test_loss", "val_accuracy": "test_acc", "val_acc": "test_acc",
    "eval_loss": "test_loss"...}``)."""
    names = {f"{peer}_{k[len('test_'):]}": k for k in figures if k.startswith("test_") for peer in ("val", "eval")}
    return {**names, **{peer: ours for peer, ours in SPELLED_OUT.items() if ours in figures}}


def evaluation_figure(name: str) -> bool:
    """Whether ``name`` is a figure of the evaluation (``test_*``, or a peer's ``val_*``)."""
    return name.startswith("test_") or peer_figure(name) != name


def check_evaluated(run: Any, figure: str, owner: str) -> None:
    """At the run's start, ``owner`` watching an evaluation figure (``test_*``, ``val_*``) with
    no evaluation set, which would fail after the first epoch: an error now (unless a callback
    of the user's, which may add figures to the rows, could give it)."""
    if not evaluation_figure(figure) or getattr(run, "eval_loader", True) is not None:
        return
    callbacks = getattr(getattr(run, "callbacks", None), "callbacks", [])
    if any(not type(cb).__module__.startswith("dptrain.") and
           (overrides(cb, "on_epoch_end") or overrides(cb, "on_train_log")) for cb in callbacks):
        return
    raise ValueError(f"{owner} monitors {figure}, a figure of the evaluation, but the run has no "
                     f"evaluation set: give eval_data (or validation_split=0.1), or monitor a training "
                     f"figure ('train_loss')")


class Monitor:
    """Whether an epoch's ``row[monitor]`` is the best so far (by more than ``min_delta``).

    ``mode``: ``"min"``, ``"max"``, or ``"auto"`` (see ``auto_mode``). NaN is never an
    improvement. Keras's and Lightning's names of the evaluation's figures are taken
    (``val_loss``, ``val_accuracy``: ``peer_figure``): a row without the name asked for
    is read at ``test_loss``, ``test_acc`` (the ``eval_data``'s), and ``news()`` says so once.
    """

    def __init__(self, monitor: str, mode: str = "auto", min_delta: float = 0.0):
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'min', 'max' or 'auto', got {mode!r}")
        if not (isinstance(min_delta, (int, float)) and min_delta >= 0):
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        if mode == "auto":
            mode = auto_mode(monitor)
        self.monitor, self.mode, self.min_delta = monitor, mode, float(min_delta)
        self.asked, self._told = monitor, False      # the name given (a peer's, before it is followed)
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None
        self.best_step: Optional[int] = None        # set when the best was an eval_every_n_steps evaluation
        self.heard_step = -1                        # the run's step at the last such evaluation

    def _follow(self, row: Row) -> None:
        """A peer's name (``val_loss``) not in ``row`` is watched as ours (``test_loss``) if the
        row has that: the evaluation's figure (a callback may add the peer's name itself)."""
        if self.monitor == self.asked and self.monitor not in row and peer_figure(self.monitor) in row:
            self.monitor = peer_figure(self.monitor)

    def _evaluation_figure(self) -> bool:
        return evaluation_figure(self.monitor)

    def news(self) -> Optional[str]:
        """Once, after a peer's name was followed: a line saying which figure is watched."""
        if self.monitor == self.asked or self._told:
            return None
        self._told = True
        return f"{self.asked} ({_whose(self.asked)}) is watched as {self.monitor}, the eval_data's figure here"

    def check_start(self, run: Any, owner: str) -> None:
        """At the run's start, an evaluation figure with no evaluation set: see ``check_evaluated``."""
        check_evaluated(run, self.asked, owner)

    def value(self, row: Row) -> float:
        self._follow(row)
        if self.monitor not in row:
            raise ValueError(f"monitor {self.monitor!r} is not in the epoch's figures "
                             f"({', '.join(k for k in row if k not in ('epoch', 'sec'))}); "
                             f"monitor one of them (test_* needs eval_data)")
        return float(row[self.monitor])

    def measured(self, run: Any, row: Row) -> bool:
        """Whether ``row`` gives the monitored figure: a ``test_*`` one is absent after the
        epochs ``eval_every`` does not evaluate, which are passed over (as Keras's callbacks
        pass over epochs without ``val_*`` figures); any other absence is an error."""
        if self._evaluation_figure() and getattr(run, "eval_loader", None) is not None \
                and not getattr(run, "evaluated_epoch", True):
            return False
        self.value(row)
        return True

    def step_evaluation(self, row: Row) -> bool:
        """Whether an ``on_train_log`` row is an evaluation of the monitored ``test_*`` figure
        (``eval_every_n_steps``), which the monitor hears as it hears the epochs'."""
        self._follow(row)
        if self.monitor.startswith("test_") and self.monitor in row:
            self.heard_step = row["step"]
            return True
        return False

    def epoch_evaluation(self, run: Any, row: Row) -> bool:
        """Whether an epoch's row is an evaluation to hear: ``measured``, and not of the
        weights a step evaluation at the epoch's last step scored already."""
        return self.measured(run, row) and not (self.monitor.startswith("test_") and
                                                getattr(run, "step", None) == self.heard_step)

    def improved(self, epoch: int, row: Row, step: Optional[int] = None) -> bool:
        """``step``: the row is a step evaluation's."""
        value = self.value(row)
        if math.isnan(value):
            return False
        better = self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                       else value > self.best + self.min_delta)
        if better:
            self.best, self.best_epoch, self.best_step = value, epoch, step
        return better

    def where(self) -> str:
        """Where the best was: ``epoch 3``, or ``step 1500 (epoch 2)``."""
        return f"epoch {self.best_epoch}" if self.best_step is None else \
            f"step {self.best_step} (epoch {self.best_epoch})"

    def state_dict(self) -> Dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "best_step": self.best_step,
                "heard_step": self.heard_step}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.best_step, self.heard_step = state.get("best_step"), state.get("heard_step", -1)


def monitored_weights(run: Any, monitor: str) -> Weights:
    """A copy, on the CPU, of the weights ``monitor`` describes: for a ``test_*`` figure those
    the evaluation ran on (the EMA's with ``EMA(evaluate=True)``), else the model's own."""
    weights = run.evaluated_weights() if monitor.startswith("test_") else run.model.state_dict()
    return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}
