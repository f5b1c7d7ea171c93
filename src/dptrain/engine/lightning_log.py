"""What a ``LightningModule``'s ``validation_step`` gives ``self.log``, kept as figures of the
evaluation: each value a mean over the batch, summed with its count, so the figure is the
mean over the whole set, as Lightning's epoch-level ``val_*`` figures are (exact over every
device and process, where Lightning's need ``sync_dist=True``).

    with Recording(replica, shard_size) as logged:      # replica.log, replica.log_dict record
        out = replica.validation_step(shard, batch_idx)
    logged.figures                                      # {"acc": (sum, count)}: test_acc in the row

A name is read as the evaluation's figure: ``val_acc`` and ``val/acc`` are ``test_acc``
(Keras's and Lightning's names of the first evaluation set are ``test_*`` here), ``val_loss``
is the test loss. A torchmetrics object logged (the module's own, which the step updates) is
kept in ``objects``: ``LightningSteps`` computes it over the whole set. Each number's figure
is a ``(sum, count)`` metric of ``fit`` (``Logged``) that reads what the shard's
``validation_step`` logged from ``Latest`` (the step's output stays what it returned: its
``logits`` feed ``metrics=``).
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

import torch
from torch import nn

from .stateful_metrics import is_stateful

#: How Lightning programs begin the names of their validation figures.
PREFIXES = ("val_", "val/", "valid_", "valid/", "validation_", "validation/")


def figure_name(logged: str) -> str:
    """The figure ``self.log(logged, ...)`` in ``validation_step`` gives, without its ``test_``:
    ``val_acc`` -> ``acc``, ``val/top5`` -> ``top5``, ``f1`` -> ``f1``."""
    for prefix in PREFIXES:
        if logged.startswith(prefix) and len(logged) > len(prefix):
            logged = logged[len(prefix):]
            break
    return logged.replace("/", "_")


class Recording:
    """While open, ``model.log(name, value, ..., batch_size=None, reduce_fx="mean")`` and
    ``model.log_dict`` record ``(value * n, n)`` by figure name (``n``: the ``batch_size``
    given, else the shard's samples), and a torchmetrics object (the module's, which its step
    updates) in ``objects``; another value, or a ``reduce_fx`` other than the mean, is an error
    naming the fix."""

    def __init__(self, model: nn.Module, samples: int):
        self.model, self.samples = model, samples
        self.figures: Dict[str, Tuple[torch.Tensor, int]] = {}
        self.objects: Dict[str, Any] = {}       # torchmetrics objects logged, by figure name
        self._had: Dict[str, Any] = {}

    def log(self, name: str, value: Any, *args: Any, batch_size: Any = None, reduce_fx: Any = "mean",
            **kwargs: Any) -> None:
        if reduce_fx not in ("mean", torch.mean):
            raise ValueError(f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): dptrain keeps the mean over the "
                             f"evaluation set of what validation_step logs; log a mean (the default)")
        if is_stateful(value):          # a torchmetrics object the module updates: computed over the whole set
            self.objects[figure_name(name)] = value
            return
        if not isinstance(value, (int, float, torch.Tensor)) or (isinstance(value, torch.Tensor)
                                                                  and value.numel() != 1):
            raise ValueError(f"self.log({name!r}, {type(value).__name__}) in validation_step: dptrain records one "
                             f"number (a batch's mean) or a torchmetrics object; log the batch's mean, or give a "
                             f"metric to fit as metrics={{name: metric}}, with validation_step returning "
                             f"{{'loss': loss, 'logits': logits}}")
        n = int(batch_size) if batch_size is not None else self.samples
        value = value.detach().reshape(()) if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        self.figures[figure_name(name)] = (value * n, n)

    def log_dict(self, dictionary: Dict[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, batch_size=kwargs.get("batch_size"), reduce_fx=kwargs.get("reduce_fx", "mean"))

    def __enter__(self) -> "Recording":
        for name in ("log", "log_dict"):         # (an instance's attribute comes before its class's method)
            if name in self.model.__dict__:
                self._had[name] = self.model.__dict__[name]
            self.model.__dict__[name] = getattr(self, name)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in ("log", "log_dict"):
            self.model.__dict__.pop(name, None)
        self.model.__dict__.update(self._had)


class Latest:
    """The figures the latest ``validation_step`` on this thread logged (each device's thread
    scores its shard right after its step), by name."""

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, figures: Dict[str, Tuple[torch.Tensor, int]]) -> None:
        self._local.figures = figures

    def get(self) -> Dict[str, Tuple[torch.Tensor, int]]:
        return getattr(self._local, "figures", {})


class Logged:
    """A ``(sum, count)`` metric of ``fit``: the figure ``name`` the ``validation_step`` of the
    shard logged (none where it logged none, or in training)."""

    def __init__(self, name: str, latest: Latest):
        self.name, self.latest = name, latest

    def __call__(self, output: Any, target: Any) -> Tuple[Any, int]:
        return self.latest.get().get(self.name, (torch.zeros(()), 0))
