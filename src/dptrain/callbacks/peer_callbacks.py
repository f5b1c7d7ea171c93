"""The peers' stock callbacks given to ``fit`` as a Keras or Lightning program gives them.

Their hooks take their framework's trainer, so none can run here as it is. Their
``EarlyStopping`` (Lightning's and Keras's) has the same settings as dptrain's, which has
their names: it is taken as dptrain's, with every setting carried over, and ``fit`` says so
in one line; so is Lightning's ``StochasticWeightAveraging``, as ``SWA``. Those that only show
what a run shows anyway (``LearningRateMonitor``: every row has the lr; the progress bars; the
model summaries) are taken as nothing, a line saying what shows it (``SHOWN``). For the others,
the error names what does their work here, their settings written in::

    lightning ModelCheckpoint(dirpath="ck", monitor="val_acc", mode="max")
        -> callbacks=[BestCheckpoint('ck/best-{epoch}.pt', monitor='val_acc', mode='max')]
    keras CSVLogger("log.csv")  -> metrics_file='log.csv'
    transformers EarlyStoppingCallback(3) -> callbacks=[EarlyStopping('eval_loss', patience=3, ...)]
"""
from __future__ import annotations

import inspect
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..engine.task import callback_list
from .hook_names import framework_class
from .swa import SWA
from .training import EarlyStopping
from .weight_averaging import LightningEMA


def _keras(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("keras", "tensorflow")


def _early_stopping(cb: Any, cls: type) -> Dict[str, Any]:
    """The settings of dptrain's ``EarlyStopping`` that does what ``cb`` does. Lightning keeps
    ``min_delta`` signed by its mode, Keras as given; Keras's ``patience=0`` (its default)
    stops at the first epoch without a best, as ``patience=1`` does here."""
    settings: Dict[str, Any] = {"monitor": cb.monitor, "patience": max(1, int(cb.patience)),
                                "min_delta": abs(float(cb.min_delta)), "mode": cb.mode}
    if _keras(cls):
        settings.update(restore_best_weights=bool(cb.restore_best_weights), baseline=cb.baseline,
                        start_from_epoch=int(getattr(cb, "start_from_epoch", 0)))
    else:
        settings.update(check_finite=bool(cb.check_finite), stopping_threshold=cb.stopping_threshold,
                        divergence_threshold=cb.divergence_threshold)
    settings["verbose"] = bool(getattr(cb, "verbose", False))
    return settings


def _swa(cb: Any, cls: type) -> Dict[str, Any]:
    """The settings of ``SWA`` that does what Lightning's ``StochasticWeightAveraging`` does (its
    own attributes; its default average is the equal mean, ours too)."""
    avg_fn = cb._avg_fn
    return {"swa_lrs": cb._swa_lrs, "swa_epoch_start": cb._swa_epoch_start,
            "annealing_epochs": cb._annealing_epochs, "annealing_strategy": cb._annealing_strategy,
            "avg_fn": None if avg_fn is getattr(cls, "avg_fn", None) else avg_fn}


def _ema_averaging(cb: Any, cls: type) -> Dict[str, Any]:
    """The settings of ``LightningEMA`` that does what Lightning's ``EMAWeightAveraging`` does: its
    decay read off its average function (``get_ema_avg_fn(decay)``: 1 against 0 gives it); an
    ``AttributeError`` (not taken: the error names ``EMA``) for settings it does not do (buffers
    left out of the average, another average function, a device of its own)."""
    kwargs = dict(cb._kwargs)
    avg_fn = kwargs.pop("avg_fn", None)
    if not cb._use_buffers or kwargs or avg_fn is None or cb._device is not None:
        raise AttributeError("settings LightningEMA does not take")
    decay = float(avg_fn(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64),
                         torch.tensor(1)))
    return {"decay": decay, "update_every_n_steps": cb.update_every_n_steps,
            "update_starting_at_step": cb.update_starting_at_step,
            "update_starting_at_epoch": cb.update_starting_at_epoch}


#: Peer callbacks taken as dptrain's (by class name): the settings reader and our class. Where
#: they differ, the line says how.
ADOPTED: Dict[str, Tuple[Callable[[Any, type], Dict[str, Any]], type, str]] = {
    "EarlyStopping": (_early_stopping, EarlyStopping, ""),
    "StochasticWeightAveraging": (_swa, SWA, " (the weights averaged at each epoch's end, the last epoch's too; "
                                             "Lightning's averages at each epoch's start)"),
    "EMAWeightAveraging": (_ema_averaging, LightningEMA, " (every evaluation on the average, the model holding it "
                                                         "when fit ends)"),
}
_DEFAULTS = {cls: {p.name: p.default for p in inspect.signature(cls).parameters.values()}
             for _, cls, _ in ADOPTED.values()}


def _adopted(cb: Any, cls: type) -> Optional[Tuple[Any, str]]:
    """Ours in place of ``cb`` and the line saying so; None if it is not adopted (or a version
    of the peer that keeps its settings under other names)."""
    reader, ours, differs = ADOPTED.get(cls.__name__, (None, None, ""))
    if reader is None:
        return None
    try:
        settings = reader(cb, cls)
    except AttributeError:
        return None
    defaults = _DEFAULTS[ours]
    shown = {k: v for k, v in settings.items() if defaults[k] is inspect.Parameter.empty or k == "monitor"
             or v != defaults[k]}
    return ours(**settings), (f"{cls.__module__.split('.')[0]}'s {cls.__name__} runs as dptrain.callbacks."
                              f"{ours.__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())}){differs}")


def adopt(callbacks: Any) -> Tuple[List[Any], List[str]]:
    """``callbacks`` (a list, or one) with each peer callback of ``ADOPTED`` as dptrain's, and
    a line saying so for each; a ``TypeError`` naming what to give instead for a peer callback
    whose work dptrain does otherwise (``INSTEAD``). Other callbacks are taken as they are
    (``CallbackList`` checks them)."""
    taken, notes = [], []
    for cb in callback_list(callbacks):         # (as Task takes them: a list, or one)
        cls = framework_class(cb)
        adopted = _adopted(cb, cls) if cls is type(cb) else None    # (a subclass of one's own: its hooks are its)
        if cls is type(cb) and cls.__name__ in SHOWN:
            notes.append(f"{cls.__module__.split('.')[0]}'s {cls.__name__} {SHOWN[cls.__name__]}")
            continue
        if adopted is not None:
            cb, line = adopted
            notes.append(line)
        elif cls is not None and (line := instead(cb)) is not None:
            raise TypeError(f"callback {type(cb).__name__} is a {cls.__module__}.{cls.__qualname__}, whose hooks take "
                            f"that framework's trainer; here give fit {line}")
        taken.append(cb)
    return taken, notes


def _model_checkpoint(cb: Any) -> str:
    if _keras(type(cb)):        # (its .keras and .weights.h5 files are torch's .pt here)
        path, best = re.sub(r"(\.weights)?\.(keras|h5)$", ".pt", str(cb.filepath)), bool(cb.save_best_only)
    else:
        name = cb.filename or "best-{epoch}"
        path, best = os.path.join(str(cb.dirpath or "checkpoints"), f"{name}.pt"), cb.monitor is not None
    if not best:
        folder = os.path.dirname(path) or "."
        return (f"checkpoint_dir={folder!r} (the run's state saved every epoch, and on Ctrl-C; resume=True goes on "
                f"from it)")
    top_k = getattr(cb, "save_top_k", 1)
    return (f"callbacks=[dptrain.callbacks.BestCheckpoint({path!r}, monitor={cb.monitor!r}, mode={cb.mode!r}"
            + (f", save_top_k={top_k}" if top_k != 1 else "") + ")] (the best epochs' weights)")


#: What does the work of each peer callback here (by class name), its settings written in.
INSTEAD: Dict[str, Callable[[Any], str]] = {
    "ModelCheckpoint": _model_checkpoint,
    "CSVLogger": lambda cb: f"metrics_file={str(getattr(cb, 'filename', 'metrics.csv'))!r} (a row per epoch)",
    "TensorBoard": lambda cb: f"tensorboard={str(getattr(cb, 'log_dir', 'logs'))!r}",
    "ReduceLROnPlateau": lambda cb: (f"scheduler=lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau("
                                     f"optimizer, factor={cb.factor}, patience={cb.patience}), "
                                     f"scheduler_monitor={cb.monitor!r}"),
    "LearningRateScheduler": lambda cb: ("scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, "
                                         "lambda epoch: FACTOR) (a factor of the optimizer's lr, where Keras's "
                                         "schedule returns the lr)"),
    "TerminateOnNaN": lambda cb: "nothing: on_nan='stop' is the default",
    "BackupAndRestore": lambda cb: (f"checkpoint_dir={str(getattr(cb, 'backup_dir', 'backup'))!r} with "
                                    f"resume=True to go on after a stop"),
    "GradientAccumulationScheduler": lambda cb: "accumulate_grad_batches=N",
    "Timer": lambda cb: "max_time= (seconds, a timedelta, or 'DD:HH:MM:SS')",
    "EarlyStoppingCallback": lambda cb: (       # (Hugging Face's: its monitor is TrainingArguments')
        f"callbacks=[dptrain.callbacks.EarlyStopping('eval_loss', patience={cb.early_stopping_patience}"
        + (f", min_delta={cb.early_stopping_threshold}" if cb.early_stopping_threshold else "")
        + ", restore_best_weights=True)] (the monitor: your metric_for_best_model, 'eval_' and its name)"),
    "LearningRateFinder": lambda cb: (      # (a subclass of one's own: Lightning's own runs, run/found_rate.py)
        f"lr=dptrain.lr_find(model, data, min_lr={getattr(cb, '_min_lr', 1e-8)!r}, "
        f"max_lr={getattr(cb, '_max_lr', 1)!r}, num_training={getattr(cb, '_num_training_steps', 100)!r}"
        f", loss=..., optimizer=...).suggestion() (the range test, before fit, with fit's keywords)"),
}


#: Peer callbacks that only show what a run shows anyway (by class name): taken as nothing, a line saying
#: what shows it here.
SHOWN: Dict[str, str] = {
    "LearningRateMonitor": "is not needed: every row has the lr (each N steps' with log_every_n_steps=N)",
    "TQDMProgressBar": "is not needed: fit's progress bar (progress=True, the default)",
    "RichProgressBar": "is not needed: fit's progress bar (progress=True, the default)",
    "ProgbarLogger": "is not needed: fit's progress bar (progress=True, the default)",
    "ModelSummary": "is not needed: print(model) shows the model (fit prints no summary table)",
    "RichModelSummary": "is not needed: print(model) shows the model (fit prints no summary table)",
    "ThroughputMonitor": "is not needed: the progress bar says samples/s and each epoch's line its seconds",
    "DeviceStatsMonitor": "is not run: fit logs no device statistics (--trace FILE.json times each device's steps)",
}


def instead(cb: Any) -> Optional[str]:
    """What to give ``fit`` in place of the peer callback ``cb``; None if nothing is known."""
    cls = framework_class(cb)
    said = INSTEAD.get(cls.__name__) if cls is not None else None
    if said is None:
        return None
    try:
        return said(cb)
    except AttributeError:      # (a version of the peer with other attribute names)
        return None
