"""``dptrain.lr_find``: the learning-rate range test (Lightning's ``Tuner.lr_find``, fastai's
``lr_find``), on any devices and processes, by ``fit`` itself.

    finder = dptrain.lr_find(model, train_set, loss=nn.CrossEntropyLoss(), optimizer=torch.optim.AdamW)
    finder.suggestion()                 # 3.1e-3: where the loss fell fastest
    finder.results["lr"], finder.results["loss"]      # each step's rate and smoothed loss

``num_training`` steps of ``fit`` (every keyword of ``fit`` but the schedule's, which the test
makes), the learning rate rising from ``min_lr`` to ``max_lr`` (every group's, as Lightning's
sets them; ``mode="exponential"`` or ``"linear"``), each step's loss smoothed as Lightning's is
(an exponential mean, ``beta`` 0.98, its start's bias divided out). The test stops once the
smoothed loss passes ``early_stop_threshold`` times the best (None: never). The suggestion is
Lightning's: the rate of the steepest fall of the smoothed loss, past the first ``skip_begin``
steps and before the last ``skip_end``. Afterwards the model's weights, and an optimizer object's
state and rates, are as they were (Lightning's restores them too); with ``update_attr`` the
suggestion is set on the model's ``lr`` or ``learning_rate`` (or its ``hparams``'), where it has one.
With several processes each step's loss is the whole global batch's (every process's summed), so
every process gets the same results.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from ..callbacks.base import BatchEnd, Callback
from ..distributed.collective import get_collective
from ..engine.task import callback_list
from .fit import CONFIG_KEYWORDS, PEER_KEYWORDS, TASK_KEYWORDS, fit
from .keywords import unexpected_keyword
from .session import run_task

#: fit's keywords the range test sets itself.
MADE_HERE = ("scheduler", "scheduler_interval", "scheduler_monitor", "lr", "epochs", "max_steps", "resume",
             "checkpoint_dir")
BETA = 0.98
#: Lightning's names for the test's own settings (its LearningRateFinder callback's, Tuner.lr_find's).
PEERS = {"num_training_steps": "num_training", "attr_name": "update_attr (it sets the model's lr or learning_rate)",
         "train_dataloaders": "data (lr_find's second argument)"}
OWN = ("min_lr", "max_lr", "num_training", "mode", "early_stop_threshold", "update_attr")


@dataclass
class LRFinder:
    """The test's ``results``: ``"lr"`` (each step's rate) and ``"loss"`` (the smoothed loss after it)."""
    results: Dict[str, List[float]] = field(default_factory=lambda: {"lr": [], "loss": []})

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> Optional[float]:
        """The rate where the smoothed loss fell fastest (Lightning's rule), or None with fewer
        than two finite losses between the skipped ends."""
        lrs, losses = self.results["lr"], self.results["loss"]
        kept = [(lr, loss) for lr, loss in list(zip(lrs, losses))[skip_begin:len(losses) - skip_end]
                if math.isfinite(loss)]
        if len(kept) < 2:
            return None
        slopes = torch.gradient(torch.tensor([loss for _, loss in kept], dtype=torch.float64))[0]
        return kept[int(torch.argmin(slopes))][0]


class _Recorder(Callback):
    """Each step's ``(loss sum, count)`` of this process, and the early stop on its smoothed loss."""

    def __init__(self, threshold: Optional[float]):
        self.threshold, self.sums, self.counts = threshold, [], []
        self.average, self.best = 0.0, math.inf

    def on_batch_end(self, run: Any, end: BatchEnd) -> None:
        total, count = end.result.numbers()
        self.sums.append(total)
        self.counts.append(count)
        step = len(self.sums)
        self.average = BETA * self.average + (1 - BETA) * (total / count if count else math.nan)
        smoothed = self.average / (1 - BETA ** step)
        if self.threshold is not None and step > 1 and (not math.isfinite(smoothed)
                                                        or smoothed > self.threshold * self.best):
            run.stop(f"lr_find: the loss passed {self.threshold:g}x its best")
        if step == 1 or smoothed < self.best:
            self.best = smoothed


class _Rising:
    """The test's schedule, ``fn(optimizer) -> scheduler``: each step's rate of ``lrs`` (the
    optimizer's rate is ``lrs[0]``). It replaces a LightningModule's configured scheduler."""
    replaces_configured = True

    def __init__(self, lrs: List[float]):
        self.lrs = lrs

    def __call__(self, optimizer: torch.optim.Optimizer) -> Any:
        lrs = self.lrs
        for group in optimizer.param_groups:        # (a scheduler built before, the module's, left its own)
            group["lr"] = group["initial_lr"] = lrs[0]
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lrs[min(i, len(lrs) - 1)] / lrs[0])


def rates(min_lr: float, max_lr: float, steps: int, mode: str) -> List[float]:
    """Each step's learning rate, from ``min_lr`` to ``max_lr``."""
    if mode not in ("exponential", "linear"):
        raise ValueError(f"mode must be 'exponential' or 'linear', got {mode!r}")
    if not 0 < min_lr < max_lr:
        raise ValueError(f"lr_find needs 0 < min_lr < max_lr, got min_lr={min_lr!r}, max_lr={max_lr!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"num_training must be a whole number >= 2 (the steps of the test), got {steps!r}")
    r = [i / (steps - 1) for i in range(steps)]
    return [min_lr * (max_lr / min_lr) ** t for t in r] if mode == "exponential" else \
        [min_lr + (max_lr - min_lr) * t for t in r]


def lr_find(model: nn.Module, data: Any, *, min_lr: float = 1e-8, max_lr: float = 1.0, num_training: int = 100,
            mode: str = "exponential", early_stop_threshold: Optional[float] = 4.0, update_attr: bool = False,
            **fit_keywords: Any) -> LRFinder:
    """The learning-rate range test of ``model`` on ``data`` (see the module docstring); the
    other keywords are ``fit``'s (``loss``, ``optimizer``, ``batch_size``, ``devices``...)."""
    known = [*OWN, *TASK_KEYWORDS, *CONFIG_KEYWORDS, "log", "eval_data"]
    for key in fit_keywords:        # (a typo or a peer's name said as lr_find's, not fit's)
        if key in PEERS or key in PEER_KEYWORDS or key not in known:
            raise unexpected_keyword("lr_find", key, known, {**PEER_KEYWORDS, **PEERS})
    made = [k for k in MADE_HERE if k in fit_keywords]
    if made:
        raise ValueError(f"lr_find sets {', '.join(made)} itself (the rates of its steps): leave "
                         f"{'it' if len(made) == 1 else 'them'} out")
    if getattr(model, "automatic_optimization", True) is False:
        raise ValueError("lr_find steps the optimizer itself; the module's training_step steps its own "
                         "(automatic_optimization off): run the test on a module that returns its loss")
    lrs = rates(min_lr, max_lr, num_training, mode)
    fit_keywords.pop("eval_data", None)       # (the test evaluates nothing, as Lightning's validates nothing)
    fit_keywords.setdefault("log", None)
    fit_keywords.setdefault("progress", False)
    callbacks = callback_list(fit_keywords.pop("callbacks", None))

    def steps(recorder: Callback) -> None:
        fit(model, data, lr=min_lr, max_steps=num_training, callbacks=callbacks + [recorder],
            scheduler_interval="batch", scheduler=_Rising(lrs), **fit_keywords)
    finder = range_test(model, fit_keywords.get("optimizer"), lrs, early_stop_threshold, steps)
    if update_attr:
        set_rate(model, finder.suggestion())
    return finder


def range_test(model: nn.Module, optimizer: Any, lrs: List[float], early_stop_threshold: Optional[float],
               steps: Callable[[Callback], None]) -> LRFinder:
    """``steps(recorder)`` trains ``len(lrs)`` steps at the rates ``lrs`` with ``recorder`` among its
    callbacks; the test's results, the model's weights (and an ``optimizer`` object's state) put
    back after it, every process's losses summed."""
    saved = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict()) if isinstance(optimizer, torch.optim.Optimizer) else None
    recorder = _Recorder(early_stop_threshold)
    try:
        steps(recorder)
    finally:
        with torch.no_grad():
            model.load_state_dict(saved)
        if saved_optimizer is not None:
            optimizer.load_state_dict(saved_optimizer)
    sums, counts = recorder.sums, recorder.counts
    collective = get_collective()
    if collective.world_size > 1 and sums:        # (every process's steps: the global batch's loss)
        total = collective.all_reduce(torch.tensor([sums, counts], dtype=torch.float64))
        sums, counts = total[0].tolist(), total[1].tolist()
    return LRFinder({"lr": lrs[:len(sums)], "loss": smoothed(sums, counts)})


def smoothed(sums: List[float], counts: List[float]) -> List[float]:
    """Each step's mean loss, smoothed as Lightning's range test smooths it."""
    out, average = [], 0.0
    for k, (total, count) in enumerate(zip(sums, counts), start=1):
        average = BETA * average + (1 - BETA) * (total / count if count else math.nan)
        out.append(average / (1 - BETA ** k))
    return out


def set_rate(model: nn.Module, lr: Optional[float]) -> None:
    """``lr`` as the model's ``lr`` or ``learning_rate`` (or its ``hparams``'), where it has one."""
    if lr is None:
        return
    for owner in (model, getattr(model, "hparams", None)):
        for name in ("lr", "learning_rate"):
            if isinstance(owner, Mapping) and name in owner:
                owner[name] = lr
                return
            if owner is not None and not isinstance(owner, Mapping) and name in vars(owner):
                setattr(owner, name, lr)
                return


#: ``dptrain train --lr-find``'s test: ``lr_find``'s defaults.
CLI_TEST = dict(min_lr=1e-8, max_lr=1.0, num_training=100, mode="exponential", early_stop_threshold=4.0)


def task_lr_find(task: Any, config: Any, log: Optional[Callable[[str], None]] = None) -> Any:
    """``dptrain train --lr-find``: the range test of a recipe's ``Task`` (``lr_find``'s defaults,
    ``CLI_TEST``) on its model and training data with the run's settings (devices, processes,
    batch size...) but its files, evaluations and schedule; returns the config with ``lr`` its
    suggestion (as it was if the test found none), a line saying which."""
    if config.lr is not None:
        raise ValueError(f"--lr-find finds the learning rate and --lr {config.lr:g} gives one: leave one out")
    if config.resume:
        raise ValueError("--lr-find with --resume: the resumed run goes on at its own rate; leave one out")
    lrs = rates(CLI_TEST["min_lr"], CLI_TEST["max_lr"], CLI_TEST["num_training"], CLI_TEST["mode"])

    def steps(recorder: Callback) -> None:
        test = dataclasses.replace(task, eval_data=None, scheduler=_Rising(lrs), scheduler_interval="batch",
                                   scheduler_monitor=None, epochs=None,
                                   callbacks=callback_list(task.callbacks) + [recorder])
        quiet = dataclasses.replace(config, lr=lrs[0], max_steps=len(lrs), epochs=None, max_time=None,
                                    validation_split=None, eval_every_n_steps=None, log_every_n_steps=None,
                                    checkpoint_dir=None, metrics_file=None, tensorboard=None, trace=None,
                                    progress=False)
        run_task(test, quiet, log=None, keep_group=True)
    finder = range_test(task.model, task.optimizer, lrs, CLI_TEST["early_stop_threshold"], steps)
    lr = finder.suggestion()
    shown = ", ".join(f"{k}={v!r}" for k, v in CLI_TEST.items())
    if lr is None:
        if log is not None:
            log(f"dptrain: --lr-find: the range test (dptrain.lr_find, {shown}) found no rate (too few finite "
                f"losses): training at the recipe's")
        return config
    if log is not None:
        log(f"dptrain: --lr-find: the range test (dptrain.lr_find, {shown}, {len(finder.results['lr'])} steps) "
            f"suggests lr {lr:.3g}: training at it")
    return dataclasses.replace(config, lr=lr)
