"""What Lightning's ``configure_optimizers`` returns, taken as ``fit``'s optimizer and schedule.

A ``LightningModule`` returns its optimizer with its scheduler in one of Lightning's forms; a
program brought over passes it on as it is::

    dptrain.fit(model, train, val, optimizer=model.configure_optimizers())
    # {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss", "interval": "epoch"}}
    # or ([opt], [scheduler]); or scheduler={"scheduler": s, "interval": "step"} (an lr_scheduler_config)

``unpack`` gives ``(optimizer, scheduler, interval, monitor)``: the config's ``interval``
(``"step"`` is our ``"batch"``) and ``monitor`` (``val_loss`` is watched as ``test_loss``);
``frequency`` other than 1 is refused (a scheduler steps every epoch or batch here), and a
setting given both ways with two values is an error naming both.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from .user_scheduler import LentScheduler

#: The keys of Lightning's ``lr_scheduler_config`` and of ``configure_optimizers``'s dict.
SCHEDULER_KEYS = frozenset({"scheduler", "interval", "frequency", "monitor", "strict", "name"})
OPTIMIZER_KEYS = frozenset({"optimizer", "lr_scheduler", "monitor"})


def is_scheduler_config(value: Any) -> bool:
    return isinstance(value, dict) and "scheduler" in value and set(value) <= SCHEDULER_KEYS


def is_optimizer_config(value: Any) -> bool:
    """Lightning's ``{"optimizer": ..., "lr_scheduler": ...}``, or ``([optimizer], [scheduler])``."""
    if isinstance(value, dict):
        return "optimizer" in value and set(value) <= OPTIMIZER_KEYS
    return (isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, list) for v in value)
            and bool(value[0]) and all(isinstance(o, torch.optim.Optimizer) for o in value[0]))


def _ours(interval: Optional[str]) -> Optional[str]:
    """Lightning's ``"step"`` is our ``"batch"`` (an update)."""
    return "batch" if interval == "step" else interval


def _agreed(name: str, given: Optional[str], configured: Optional[str], default: Optional[str]) -> Optional[str]:
    """The config's value, unless fit's keyword says another."""
    if configured is None:
        return given
    if given not in (default, configured):
        raise ValueError(f"{name}={given!r} and Lightning's config's {configured!r}: give one of them")
    return configured


def unpack(optimizer: Any, scheduler: Any, interval: Optional[str],
           monitor: Optional[str]) -> Tuple[Any, Any, Optional[str], Any]:
    """``(optimizer, scheduler, scheduler_interval, scheduler_monitor)`` with Lightning's forms
    of them taken apart (other values pass as they are; an interval not given is None, which
    the config's, when it has one, replaces)."""
    config_monitor = None
    if is_optimizer_config(optimizer):
        if getattr(scheduler, "replaces_configured", False):      # (lr_find's rising rates: the config's left out)
            optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
            optimizer = optimizer[0][0] if isinstance(optimizer, tuple) and len(optimizer[0]) == 1 else optimizer
            return optimizer, scheduler, interval, monitor
        if scheduler is not None:
            raise ValueError("optimizer= is Lightning's configure_optimizers() output, which holds the scheduler: "
                             "drop scheduler=")
        if isinstance(optimizer, dict):
            optimizer, scheduler, config_monitor = (optimizer["optimizer"], optimizer.get("lr_scheduler"),
                                                    optimizer.get("monitor"))
        else:
            optimizers, schedulers = optimizer
            if len(optimizers) > 1 or len(schedulers) > 1:
                raise ValueError(f"configure_optimizers() gave {len(optimizers)} optimizers and {len(schedulers)} "
                                 f"schedulers: with one loss give optimizer={{name: optimizer}} and scheduler="
                                 f"{{name: fn}}; optimizers taking turns need step={{name: fn}} too (see the README)")
            optimizer, scheduler = optimizers[0], (schedulers[0] if schedulers else None)
    if is_scheduler_config(scheduler):
        frequency = scheduler.get("frequency", 1)
        if frequency != 1:
            raise ValueError(f"Lightning's lr_scheduler_config frequency={frequency!r}: a scheduler steps every "
                             f"epoch or every batch here; give frequency 1 (and a schedule N times slower)")
        interval = _agreed("scheduler_interval", _ours(interval), _ours(scheduler.get("interval")), None)
        config_monitor = scheduler.get("monitor", config_monitor)
        scheduler = scheduler["scheduler"]
    if config_monitor is not None and monitor is None \
            and not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return optimizer, scheduler, interval, None     # (Lightning takes one for any scheduler; a plateau reads it)
    return optimizer, scheduler, interval, _agreed("scheduler_monitor", monitor, config_monitor, None)


def manual_optimizers(configured: Any) -> Tuple[Dict[str, torch.optim.Optimizer], Dict[str, Any]]:
    """A manual-optimization module's optimizers and schedulers (``manual_optimization.py``), by
    their place in what ``configure_optimizers`` returned ("0", "1"...): one optimizer, a list of
    them, ``([optimizers], [schedulers])``, a dict ``{"optimizer": ..., "lr_scheduler": ...}`` or
    a list of such dicts. Each scheduler (or ``lr_scheduler_config``) goes with the optimizer it
    was built on, lent to the run's (``LentScheduler``); a ``TypeError`` names any other form."""
    optimizers: List[Any] = []
    schedulers: List[Any] = []
    items = configured if isinstance(configured, (list, tuple)) else [configured]
    if isinstance(configured, tuple) and len(configured) == 2 and all(isinstance(v, list) for v in configured):
        optimizers, schedulers = list(configured[0]), list(configured[1])
    else:
        for item in items:
            if isinstance(item, dict) and "optimizer" in item and set(item) <= OPTIMIZER_KEYS:
                optimizers.append(item["optimizer"])
                if item.get("lr_scheduler") is not None:
                    schedulers.append(item["lr_scheduler"])
            else:
                optimizers.append(item)
    if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise TypeError(f"configure_optimizers() gave {type(configured).__name__}: with automatic_optimization off, "
                        f"training_step steps the optimizers it returns, so return them (one optimizer, a list, "
                        f"([optimizers], [schedulers]) or {{'optimizer': ..., 'lr_scheduler': ...}} dicts)")
    named = {str(k): o for k, o in enumerate(optimizers)}
    lent: Dict[str, Any] = {}
    for scheduler in schedulers:
        scheduler = scheduler["scheduler"] if is_scheduler_config(scheduler) else scheduler
        home = next((k for k, o in named.items() if getattr(scheduler, "optimizer", None) is o), None)
        if home is None:
            raise TypeError(f"configure_optimizers() gave a {type(scheduler).__name__} not built on one of its "
                            f"optimizers: build each scheduler on the optimizer it schedules")
        if home in lent:
            raise ValueError(f"configure_optimizers() gave two schedulers of optimizer {home}: give one each")
        lent[home] = LentScheduler(scheduler, named[home])
    return named, lent
