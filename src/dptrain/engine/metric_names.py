"""Metrics by name, as Keras's ``compile(metrics=["accuracy"])`` takes them: ``fit`` and
``evaluate`` accept a list of names beside the dict ``{name: fn(output, target) -> (sum, count)}``.

Each name becomes a metric of that form, so it is exact over the whole set on any number of
devices and processes (a sum and a count, added up):

- ``"accuracy"`` (``"acc"``, Keras's ``"binary_accuracy"``, ``"sparse_categorical_accuracy"``,
  ``"categorical_accuracy"``): with a classification loss nothing is added, as ``test_acc`` is
  counted already; with ``nn.BCEWithLogitsLoss`` (``"bce"``) the share of outputs on the
  target's side of 0 (logits), with ``nn.BCELoss`` of 0.5 (probabilities), as ``test_acc``;
  with any other loss, or a step function, an error showing the metric to write.
- ``"mae"``, ``"mse"`` (and Keras's long names): the mean absolute and squared error per
  element, as ``test_mae``, ``test_mse``; with ``nn.BCEWithLogitsLoss``, of the probabilities
  (``sigmoid`` of the logits), as Keras's sigmoid output gives them.

A metric object in the list (torchmetrics' ``F1Score(...)``; or given alone, ``metrics=AUROC(...)``)
is named by its class, as torchmetrics' ``MetricCollection([...])`` names it (``test_BinaryAUROC``);
a ``whole_set(fn)`` by its keys. Any other name is an error naming these, and the dict form
(``{name: fn(output, target) -> (sum, count)}`` or ``{name: metric object}``)::

    metrics_named(["accuracy", "mae"], nn.BCEWithLogitsLoss(), None)   # {"acc": ..., "mae": ...}
"""
from __future__ import annotations

import difflib
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .loss_names import loss_named
from .loss_kinds import as_module, scores_accuracy
from .stateful_metrics import is_stateful
from .whole_set import WholeSet

#: Keras's names of an accuracy (``test_acc`` here).
ACCURACY = ("accuracy", "acc", "binary_accuracy", "sparse_categorical_accuracy", "categorical_accuracy")


def _elements(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``output`` as ``target``'s elements: an ``(N, 1)`` output for ``(N,)`` targets is
    reshaped (not broadcast into ``N * N`` pairs); other shapes must match."""
    if output.shape != target.shape:
        if output.numel() != target.numel():
            raise ValueError(f"the metric got outputs of shape {tuple(output.shape)} for targets of shape "
                             f"{tuple(target.shape)}: it compares them element by element; give targets of the "
                             f"outputs' shape")
        output = output.reshape(target.shape)
    return output


def mean_absolute_error(output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """Keras's ``"mae"``: the sum of absolute errors and the elements it is over."""
    return (_elements(output, target) - target).abs().sum(), target.numel()


def mean_squared_error(output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """Keras's ``"mse"``: the sum of squared errors and the elements it is over."""
    return ((_elements(output, target) - target) ** 2).sum(), target.numel()


def binary_accuracy(threshold: float) -> Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, int]]:
    """Outputs above ``threshold`` (0 for logits, 0.5 for probabilities) counted right where
    the target is above 0.5: the correct elements and the elements."""
    def accuracy(output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, int]:
        return ((_elements(output, target) > threshold) == (target > 0.5)).sum(), target.numel()
    accuracy.__qualname__ = f"binary_accuracy(threshold={threshold:g})"
    return accuracy


def on_probabilities(metric: Callable) -> Callable:
    """``metric`` of a binary classifier's probabilities, ``sigmoid(logits)``."""
    def of_probabilities(output: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, int]:
        return metric(torch.sigmoid(output), target)
    of_probabilities.__qualname__ = f"{metric.__name__}(sigmoid(output))"
    return of_probabilities


def _binary_threshold(loss: Any) -> Optional[float]:
    """Where a binary cross-entropy's output turns from one class to the other: 0 for logits,
    0.5 for probabilities; None for any other loss."""
    loss = as_module(loss)          # (a partial of torch's function: its module)
    if isinstance(loss, nn.BCEWithLogitsLoss) or loss is F.binary_cross_entropy_with_logits:
        return 0.0
    if isinstance(loss, nn.BCELoss) or loss is F.binary_cross_entropy:
        return 0.5
    return None


#: Keras's error metrics by name: dptrain's name and the metric.
ERRORS = {"mae": ("mae", mean_absolute_error), "mean_absolute_error": ("mae", mean_absolute_error),
          "mse": ("mse", mean_squared_error), "mean_squared_error": ("mse", mean_squared_error)}


def no_accuracy(loss: Any, step: Any) -> str:
    """Why ``metrics=["accuracy"]`` has no meaning with ``loss`` or ``step``, and what to write."""
    what = "a step function" if step is not None else f"the loss {type(loss).__name__}"
    return (f"metrics=['accuracy']: with {what} dptrain knows no accuracy (it does with a cross-entropy or a binary "
            f"cross-entropy loss): give your own, e.g. metrics={{'acc': lambda output, target: "
            f"(((output > 0) == (target > 0.5)).sum(), target.numel())}} for a binary classifier's logits "
            f"(output > 0.5 for probabilities)")


def metrics_named(names: Sequence[Any], loss: Any, step: Any) -> Dict[str, Callable]:
    """Keras's list of metric names as dptrain's dict (``{name: fn(output, target) -> (sum,
    count)}``) for a run with ``loss`` (a module, function or name; None: the default
    cross-entropy) or ``step``. A ``TypeError`` for an item not a name, a ``ValueError`` for a
    name not known or an accuracy with no meaning here."""
    loss = loss_named(loss) if isinstance(loss, str) else loss
    metrics: Dict[str, Callable] = {}
    for name in names:
        if is_stateful(name):
            _put_object(metrics, name)
            continue
        if not isinstance(name, str):
            raise TypeError(f"metrics as a list takes Keras's names ('accuracy', 'mae', 'mse') and metric objects "
                            f"(torchmetrics'), got {type(name).__name__}: give a dict {{name: fn(output, target) -> "
                            f"(sum, count)}} for a function")
        if name in ACCURACY:
            if step is None and scores_accuracy(loss):
                continue        # (a classification's accuracy: test_acc, counted already)
            threshold = _binary_threshold(loss) if step is None else None
            if threshold is not None:
                metrics["acc"] = binary_accuracy(threshold)
                continue
            raise ValueError(no_accuracy(loss, step))
        if name in ERRORS:
            short, metric = ERRORS[name]
            # a binary classifier's logits: the error of its probabilities, as Keras's model gives them
            metrics[short] = on_probabilities(metric) if step is None and _binary_threshold(loss) == 0.0 else metric
            continue
        near = difflib.get_close_matches(name, [*ACCURACY, *ERRORS], n=1)
        raise ValueError(f"unknown metric {name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                         + f"; metrics by name are {', '.join(ACCURACY[:1] + tuple(ERRORS))}; any other is a dict "
                         f"{{name: fn(output, target) -> (sum, count)}} or {{name: torchmetrics object}}, e.g. "
                         f"metrics={{'auc': torchmetrics.AUROC(task='binary')}}")
    return metrics


def _put_object(metrics: Dict[str, Any], metric: Any) -> None:
    """A metric object given without a name, named as torchmetrics' ``MetricCollection([...])``
    names it, by its class (``MulticlassF1Score``); ``whole_set(fn)``'s keys name its figures."""
    name = "" if isinstance(metric, WholeSet) else type(metric).__name__
    if name in metrics:
        what = "two dptrain.whole_set metrics" if not name else f"two metrics named {name!r} (by their class)"
        raise ValueError(f"metrics: {what} in the list; give a dict naming each, e.g. metrics={{'f1_macro': ..., "
                         f"'f1_micro': ...}}")
    metrics[name] = metric


def metrics_copied(metrics: Any) -> Any:
    """``fit``'s and ``evaluate``'s ``metrics`` as ``Task`` takes them, the caller's own left as
    they are: a dict (of a mapping; None: none), a list (Keras's names), or one metric object
    (``whole_set(compute_metrics)``, whose keys name the figures) as it is."""
    if isinstance(metrics, (list, tuple)):
        return list(metrics)
    return dict(metrics or {}) if metrics is None or hasattr(metrics, "keys") else metrics
