"""Callbacks every training program wants: early stopping and an EMA (what watches a figure is
``monitor.py``; the best epochs' weights are ``best_checkpoint.py``'s).

They use only the protocol a user's callback has (``base.py``), keep their state in
checkpoints (so a Ctrl-C and ``--resume`` change nothing), and decide from the epoch rows,
which are the same on every process, so every rank decides alike.

    stop = EarlyStopping(monitor="test_loss", patience=3)
    best = BestCheckpoint("runs/best.pt", monitor="test_acc")      # mode "max": accuracy
    ema = EMA(decay=0.999, evaluate=True)                           # evaluate the average
    dptrain.fit(model, train, test, epochs=50, callbacks=[stop, best, ema])
    model.load_state_dict(torch.load("runs/best.pt")["model"])     # the best epoch's average
    ema.copy_to(model)                                             # or the last one
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from .base import BatchEnd, Callback, Row
from .monitor import Monitor, Weights, monitored_weights


def verbosity(verbose: Any) -> bool:
    """Keras's ``verbose`` (0, 1) or Lightning's (False, True): whether to say more."""
    if not isinstance(verbose, (bool, int)) or verbose < 0:
        raise ValueError(f"verbose must be True, False or a number >= 0, got {verbose!r}")
    return bool(verbose)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


class EarlyStopping(Callback):
    """End the run once ``monitor`` has not improved for ``patience`` epochs (Keras's rule:
    by more than ``min_delta``; ``mode`` as in ``Monitor``). With ``restore_best_weights``
    the model ends the run with the best epoch's weights (as Keras 3 does, stopped early or
    not), on every device and process; they are kept on the CPU, and in checkpoints.
    ``start_from_epoch=N`` (Keras's; Lightning's ``min_epochs``): the first N epochs are a
    warm-up, not watched (their figures are neither a best nor a reason to stop). The stop
    and the restore are always said; ``verbose`` says every evaluation heard too (Keras's and
    Lightning's argument: true, or a number above 0).

    Thresholds (each None by default): ``baseline`` (Keras's): patience runs until a best also
    beats it; ``stopping_threshold`` (Lightning's): stop once the figure is better than it (a
    target reached); ``divergence_threshold`` (Lightning's): stop once it is worse (a run gone
    astray). ``check_finite`` (Lightning's, on by default): stop once the figure is NaN or
    infinite, which no later epoch can follow as better (False: such an epoch is no
    improvement, and patience runs on)."""

    def __init__(self, monitor: str = "test_loss", patience: int = 3, min_delta: float = 0.0, mode: str = "auto",
                 restore_best_weights: bool = False, start_from_epoch: int = 0, verbose: Union[bool, int] = False,
                 baseline: Optional[float] = None, stopping_threshold: Optional[float] = None,
                 divergence_threshold: Optional[float] = None, check_finite: bool = True):
        for name, value, least in (("patience", patience, 1), ("start_from_epoch", start_from_epoch, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
        thresholds = {"baseline": baseline, "stopping_threshold": stopping_threshold,
                      "divergence_threshold": divergence_threshold}
        for name, value in thresholds.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or math.isnan(value)):
                raise ValueError(f"{name} must be a number (or None), got {value!r}")
        self.baseline, self.stopping_threshold, self.divergence_threshold = baseline, stopping_threshold, \
            divergence_threshold
        self.start_from_epoch, self.verbose = start_from_epoch, verbosity(verbose)
        self.watch, self.patience, self.wait = Monitor(monitor, mode, min_delta), patience, 0
        self.restore_best_weights = _flag("restore_best_weights", restore_best_weights)
        self.check_finite = _flag("check_finite", check_finite)
        self.stopped_epoch: Optional[int] = None
        self.best_weights: Optional[Weights] = None

    def on_fit_start(self, run: Any) -> None:
        self.watch.check_start(run, "EarlyStopping")

    def on_train_log(self, run: Any, row: Row) -> None:
        if self.watch.step_evaluation(row):
            self._heard(run, row["epoch"], row, row["step"])

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        if self.watch.epoch_evaluation(run, row):        # (patience counts the evaluations)
            self._heard(run, epoch, row, None)

    def _heard(self, run: Any, epoch: int, row: Row, step: Optional[int]) -> None:
        if epoch <= self.start_from_epoch:
            return
        news = self.watch.news()
        if news:
            run.log(f"EarlyStopping: {news}")
        name, value = self.watch.monitor, self.watch.value(row)
        at = f"epoch {epoch}" if step is None else f"step {step} (epoch {epoch})"
        improved = self.watch.improved(epoch, row, step)
        if improved and self.restore_best_weights:
            self.best_weights = monitored_weights(run, name)
        if improved and self._better(value, self.baseline):
            self.wait = 0
            if self.verbose:
                run.log(f"EarlyStopping: {at}, {name} {value:.4g}, the best so far")
        else:
            self.wait += 1
            if self.verbose:
                short = f"not past the baseline {self.baseline:.4g}" if improved else \
                    f"not better than {self.watch.best:.4g} ({self.watch.where()})"
                run.log(f"EarlyStopping: {at}, {name} {value:.4g}, {short} for {self.wait} of {self.patience}")
        reason = None
        if self.check_finite and not math.isfinite(value):
            reason = f"{name} is {value}, not finite (check_finite=False: patience runs on)"
        elif self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            reason = f"{name} {value:.4g} reached stopping_threshold {self.stopping_threshold:.4g}"
        elif self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
            reason = f"{name} {value:.4g} is worse than divergence_threshold {self.divergence_threshold:.4g}"
        elif self.wait >= self.patience:
            unit = "epoch(s)" if self.watch.heard_step < 0 else "evaluation(s)"
            reason = f"{name} did not improve for {self.patience} {unit} (best {self.watch.best:.4g} at " \
                     f"{self.watch.where()})"
        if reason is not None:
            self.stopped_epoch = epoch
            run.stop(reason)

    def _better(self, value: float, than: Optional[float]) -> bool:
        """Whether ``value`` is better than ``than`` (by the mode; anything is, than None)."""
        return than is None or (value < than if self.watch.mode == "min" else value > than)

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        if self.best_weights is not None and self.restore_best_weights:
            run.load_weights(self.best_weights)
            best, step = self.watch.best_epoch, self.watch.best_step
            run.log(f"restored the weights of {self.watch.where()} ({self.watch.monitor} {self.watch.best:.4g})")
            # The result's figures are those of the weights the model ends with: that epoch's
            # (a step evaluation's: its test figures; the training ones are no epoch's).
            if step is None:
                row = next((r for r in run.history if r["epoch"] == best), None)
                if row is not None:
                    result.update({k: v for k, v in row.items() if k.startswith(("train_", "test_"))})
                    result["restored_epoch"] = best
            else:
                row = next((r for r in result.get("step_history", []) if r["step"] == step), {})
                result.update({k: v for k, v in row.items() if k.startswith("test_")})
                result.update(restored_epoch=best, restored_step=step)

    def state_dict(self) -> Dict[str, Any]:
        kept = {"best_weights": self.best_weights} if self.best_weights is not None else {}
        return {**self.watch.state_dict(), "wait": self.wait, "stopped_epoch": self.stopped_epoch, **kept}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.watch.load_state_dict(state)
        self.wait, self.stopped_epoch = state["wait"], state["stopped_epoch"]
        self.best_weights = state.get("best_weights")


class EMA(Callback):
    """An exponential moving average of the weights, updated after every step that updated
    the model: ``ema = decay * ema + (1 - decay) * weight`` (floating-point parameters and
    buffers; integer buffers such as BatchNorm's count are copied). It starts from the
    weights before the first step, and lives on the model's device, in every process (their
    weights are equal, so theirs are too).

    With ``evaluate=True`` every epoch's evaluation runs on the average (as Keras's
    ``use_ema`` and Lightning's ``WeightAveraging`` do): it is loaded on every device for
    the evaluation and the trained weights are put back after it, so training goes on
    unchanged; ``BestCheckpoint`` and ``EarlyStopping(restore_best_weights=True)`` on a
    ``test_*`` figure then keep the average that scored it.

    >>> ema = EMA(0.999); dptrain.fit(model, data, callbacks=[ema]); ema.copy_to(model)
    """

    def __init__(self, decay: float = 0.999, evaluate: bool = False):
        if not (isinstance(decay, (int, float)) and 0.0 <= decay < 1.0):
            raise ValueError(f"decay must be a number in [0, 1), got {decay!r}")
        self.decay, self.evaluate = float(decay), _flag("evaluate", evaluate)
        self.weights: Weights = {}
        self.updates = 0
        self._trained: Optional[Weights] = None     # set while the average is loaded

    def on_evaluate_start(self, run: Any, epoch: int) -> None:
        if self.evaluate:
            self._trained = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
            run.load_weights(self.weights)

    def on_evaluate_end(self, run: Any, epoch: int, metrics: Dict[str, float]) -> None:
        self._put_back(run)

    def on_exception(self, run: Any, error: BaseException) -> None:
        self._put_back(run)

    def _put_back(self, run: Any) -> None:
        if self._trained is not None:
            trained, self._trained = self._trained, None
            run.load_weights(trained)

    def on_fit_start(self, run: Any) -> None:
        current = run.model.state_dict()
        if not self.weights:
            self.weights = {k: v.detach().clone() for k, v in current.items()}
        else:               # resumed (kept on the CPU in checkpoints): back to the model's devices
            self.weights = {k: v.to(current[k].device) for k, v in self.weights.items()}

    @torch.no_grad()
    def on_batch_end(self, run: Any, batch: BatchEnd) -> None:
        if not batch.result.stepped:
            return
        for name, value in run.model.state_dict().items():
            average = self.weights[name]
            if average.is_floating_point():
                average.mul_(self.decay).add_(value.detach(), alpha=1.0 - self.decay)
            else:
                average.copy_(value)
        self.updates += 1

    def copy_to(self, module: nn.Module) -> None:
        """Load the averaged weights into ``module`` (the trained model, or a fresh copy)."""
        module.load_state_dict(self.weights)

    def state_dict(self) -> Dict[str, Any]:
        return {"weights": {k: v.detach().cpu() for k, v in self.weights.items()}, "updates": self.updates}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.weights = {k: v.clone() for k, v in state["weights"].items()}
        self.updates = state["updates"]
