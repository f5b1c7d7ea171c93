"""Metrics over the whole evaluation set: ``torchmetrics`` objects (or anything shaped like one).

A metric that is a ``(sum, count)`` function adds up exactly by itself. Macro-F1, AUC or a
confusion matrix do not: they need the whole set. A stateful metric object (``update``,
``compute``, ``reset``, as every ``torchmetrics.Metric`` has) does: each device updates a
copy of its own with its shards, the copies are merged (``merge_state``), and ``compute``
gathers the states of every process (torchmetrics does that itself over the process group
dptrain joined) before computing. Every sample is in exactly one shard of one process, so the
figure is the one a single device computes over the whole set, however it divides.

    fit(model, train, test, metrics={"f1": MulticlassF1Score(10, average="macro"),
                                     "auc": MulticlassAUROC(10)})
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Dict, List, Sequence, Tuple

import torch

COMPUTED = "computed"       # the key of these metrics' values among the evaluation's totals


def is_stateful(metric: Any) -> bool:
    """A metric object (``update``/``compute``/``reset``), not a ``(sum, count)`` function."""
    return all(callable(getattr(metric, name, None)) for name in ("update", "compute", "reset"))


def pair_metric_names(metrics: Mapping[str, Any]) -> List[str]:
    """The names of the ``(sum, count)`` metrics, summed with the loss."""
    return [name for name, m in metrics.items() if not is_stateful(m)]


class StatefulMetrics:
    """One copy of each metric object per device, for one evaluation at a time.

    >>> stateful = StatefulMetrics({"f1": f1}, devices)
    >>> stateful.reset(); stateful.update(i, output, target)   # on device i's thread
    >>> stateful.compute()                                     # {"f1": 0.83}: the whole set
    """

    def __init__(self, metrics: Mapping[str, Any], devices: Sequence[torch.device]):
        self.devices = list(devices)
        #: This process alone (``evaluate(local=True)``): compute without gathering the others'.
        self.alone = False
        self.copies: Dict[str, List[Any]] = {}
        for name, metric in _members(metrics):
            self._check_merges(name, metric)
            self.copies[name] = [_to(copy.deepcopy(metric), d) for d in self.devices]

    @classmethod
    def of_copies(cls, copies: Dict[str, List[Any]], devices: Sequence[torch.device]) -> "StatefulMetrics":
        """Over copies that exist, one per device (a model's own metric attribute on each
        replica, which a LightningModule's ``validation_step`` updates and logs)."""
        made = cls({}, devices)
        for name, each in copies.items():
            made._check_merges(name, each[0])
        made.copies = copies
        return made

    def _check_merges(self, name: str, metric: Any) -> None:
        if len(self.devices) > 1 and not callable(getattr(metric, "merge_state", None)):
            raise TypeError(f"metric {name!r} ({type(metric).__name__}) has no merge_state, which combines "
                            f"its copies on several devices: upgrade torchmetrics (>= 1.3), or use one device")

    def __bool__(self) -> bool:
        return bool(self.copies)

    def reset(self) -> None:
        for copies in self.copies.values():
            for m in copies:
                m.reset()

    def update(self, i: int, output: Any, target: Any) -> None:
        for name, copies in self.copies.items():
            try:
                copies[i].update(output, target)
            except Exception as e:
                raised_by(e, name, copies[i], output, target)
                raise

    def _merged(self, copies: List[Any]) -> Any:
        merged = copy.deepcopy(copies[0])
        merge_into(merged, copies[1:], self.devices[0])
        return merged

    def states(self) -> Dict[str, Dict[str, Any]]:
        """Each metric's state in this process (its device copies merged), on the CPU, for a
        checkpoint (``metric_state``: tensors, or lists of them for AUROC-like metrics)."""
        return {name: {k: _cpu(v) for k, v in self._merged(copies).metric_state.items()}
                for name, copies in self.copies.items()}

    def load(self, states: Sequence[Dict[str, Dict[str, Any]]]) -> bool:
        """Add saved ``states`` (one dict per saved process) to the first device's copies;
        whether they could be (a metric that cannot merge states is reset)."""
        try:
            for name, copies in self.copies.items():
                for saved in states:
                    if name in saved:
                        copies[0].merge_state({k: _on(v, self.devices[0]) for k, v in saved[name].items()})
        except (RuntimeError, ValueError, TypeError):
            self.reset()
            return False
        return True

    def compute(self) -> Dict[str, Any]:
        """Merge each metric's device copies, then compute (over every process): plain
        numbers, or nested lists for tensors of several numbers."""
        out: Dict[str, Any] = {}
        for name, copies in self.copies.items():
            merged = self._merged(copies)
            if self.alone:          # (torchmetrics gathers whenever a process group exists)
                merged.sync_on_compute = merged._to_sync = False
                merged.distributed_available_fn = lambda: False
            value = merged.compute()
            if isinstance(value, Mapping):      # (named "": a metric given alone, its keys the names)
                out.update({f"{name}_{k}" if name else k: _plain(v) for k, v in value.items()})
            else:
                out[name or getattr(merged, "name", "metric")] = _plain(value)
        return out


def raised_by(e: Exception, name: str, metric: Any, output: Any, target: Any) -> None:
    """Note on ``e`` (Python >= 3.11) which metric raised it, and on what: with several, the
    error of torchmetrics' own does not say which."""
    def shape(x: Any) -> str:
        return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
    if hasattr(e, "add_note"):
        kind = getattr(metric, "__name__", None) if callable(metric) and not is_stateful(metric) else None
        e.add_note(f"dptrain: raised by metric {name!r} ({kind or type(metric).__name__}) on an output of shape "
                   f"{shape(output)} and a target of shape {shape(target)}")


def _members(metrics: Mapping[str, Any]) -> List[Tuple[str, Any]]:
    """``(name, metric object)`` of each stateful metric, a collection of them (torchmetrics'
    ``MetricCollection``, which has no ``merge_state``) giving each of its members, named as
    its ``compute()`` names them: ``{name}_{key}``, the collection's prefix in the key."""
    out: List[Tuple[str, Any]] = []
    for name, metric in metrics.items():
        if not is_stateful(metric):
            continue
        if not callable(getattr(metric, "merge_state", None)) and callable(getattr(metric, "items", None)):
            try:
                members = list(metric.items(keep_base=False))
            except TypeError:
                members = list(metric.items())
            if members and all(is_stateful(m) for _, m in members):
                out.extend((f"{name}_{key}", m) for key, m in members)
                continue
        out.append((name, metric))
    return out


def merge_into(metric: Any, others: Sequence[Any], device: torch.device) -> None:
    """Add the states of ``others`` (copies of ``metric`` on other devices, left as they are) to
    ``metric``'s, on ``device``."""
    for other in others:
        metric.merge_state(_to(copy.deepcopy(other), device))


def _to(metric: Any, device: torch.device) -> Any:
    return metric.to(device) if callable(getattr(metric, "to", None)) else metric


def _cpu(value: Any) -> Any:
    return [v.detach().cpu() for v in value] if isinstance(value, list) else value.detach().cpu()


def _on(value: Any, device: torch.device) -> Any:
    return [v.to(device) for v in value] if isinstance(value, list) else value.to(device)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value
