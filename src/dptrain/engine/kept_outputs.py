"""What a LightningModule's steps keep for its epoch-end hooks, put together over the devices'
copies of the module.

Lightning's habit: the steps append their outputs to lists the module holds, and an epoch-end
hook reads them and clears them (a metric object the steps update, the hook computes):

    def validation_step(self, batch, batch_idx):
        self.scores.append(self(batch[0]).softmax(1)); self.labels.append(batch[1])

    def on_validation_epoch_end(self):
        self.log("val_auc", auroc(torch.cat(self.scores), torch.cat(self.labels)))
        self.scores.clear(); self.labels.clear()

On several devices of a process each device's copy appends its part of each batch to lists of
its own, and updates its own copy of each metric object. ``KeptOutputs.gather``, before the
hooks run on the module (the first copy), puts into the module's lists what every copy
appended since the epoch began, in the batches' order (each copy's j-th call took its part of
the j-th batch: the first device's part, then the second's...), the training's items and the
evaluation's each in their place, and cuts the copies' lists back; each metric object the steps
do not log is merged into the module's (``merge_state``) and its copies reset. The hooks then
read what one device's module would hold. ``outputs_kept``: a call that is not one of the run's
steps (a trial, a loss for an evaluation) leaves the lists and the metric objects as they were.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Sequence, Set, Tuple

import torch
from torch import nn

from .stateful_metrics import is_stateful, merge_into


def metric_objects(module: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(path, metric)`` of each metric object among the module's submodules (a torchmetrics
    ``Metric``; a ``MetricCollection``'s members, not the collection)."""
    return [(path, m) for path, m in module.named_modules()
            if is_stateful(m) and not callable(getattr(m, "items", None))]


def held_lists(module: nn.Module, in_metrics: bool = True) -> List[Tuple[str, list]]:
    """Each list the module's submodules hold, as an attribute or as a value of a dict attribute
    (``self.outputs = {"preds": [], "labels": []}``), by where it is; ``in_metrics`` False: not
    those of metric objects (their states, merged as metrics are)."""
    inside: Set[int] = set() if in_metrics else {id(s) for _, m in metric_objects(module) for s in m.modules()}
    found = []
    for path, m in module.named_modules():
        if id(m) in inside:
            continue
        for name, value in vars(m).items():
            if type(value) is list:
                found.append((f"{path}:{name}", value))
            elif isinstance(value, dict) and not name.startswith("_"):
                found.extend((f"{path}:{name}[{k!r}]", v) for k, v in value.items() if type(v) is list)
    return found


@contextmanager
def outputs_kept(model: nn.Module, lists: bool = True) -> Iterator[None]:
    """What the model's steps keep, its metric objects' states and (``lists``) its modules' lists,
    as after the block as before: what a call that is not one of the run's steps added (the trial
    before training, ``training_step`` giving an evaluation's loss) is dropped."""
    held = [(v, len(v)) for _, v in held_lists(model)] if lists else []
    saved = []
    for _, metric in metric_objects(model):
        state = getattr(metric, "metric_state", None)       # (torchmetrics'; another's is left)
        if state is not None:
            saved.append((metric, {k: list(v) if isinstance(v, list) else v.clone() for k, v in state.items()},
                          getattr(metric, "_update_count", None)))
    try:
        yield
    finally:
        for kept, n in held:
            del kept[n:]
        for metric, state, count in saved:
            for k, v in state.items():
                setattr(metric, k, v)
            if count is not None:
                metric._update_count, metric._computed = count, None


def interleaved(news: Sequence[list], calls: Sequence[int]) -> list:
    """The items each copy appended (``news``, in ``calls`` calls each) in the batches' order:
    each call's items, the copies in turn; copies whose counts do not divide alike (a step that
    appends only sometimes), one copy's after the other's."""
    each = {len(n) // c if c and len(n) % c == 0 else -1 for n, c in zip(news, calls) if n}
    if len(each) != 1 or -1 in each:
        return [item for n in news for item in n]
    m = each.pop()
    return [item for j in range(max(calls)) for n, c in zip(news, calls) if j < c for item in n[j * m:(j + 1) * m]]


class KeptOutputs:
    """The devices' copies of one run's module (``replicas``, the first the module) and what
    their steps keep (see the module docstring): ``start`` as an epoch trains, ``evaluating``
    as its evaluation starts, ``count`` each step's call, ``gather`` before the epoch-end hooks."""

    def __init__(self, replicas: Sequence[nn.Module], device: torch.device):
        self.replicas, self.device = list(replicas), device
        self.index = {id(r): i for i, r in enumerate(self.replicas)}
        for path, metric in metric_objects(self.replicas[0]):
            if not callable(getattr(metric, "merge_state", None)):
                raise TypeError(f"the module's metric {path!r} ({type(metric).__name__}) has no merge_state, which "
                                f"puts its devices' copies together for the epoch-end hooks: upgrade torchmetrics "
                                f"(>= 1.3), or train on one device a process (devices=1)")
            for replica in self.replicas[1:]:       # (copies of the module's state, which is counted once)
                replica.get_submodule(path).reset()
        self.start()

    def _lengths(self) -> List[Dict[str, int]]:
        return [{key: len(v) for key, v in held_lists(r, False)} for r in self.replicas]

    def start(self) -> None:
        """An epoch's training starts: the items each copy holds now are not its."""
        self.marks, self.calls = [self._lengths()], [[0] * len(self.replicas)]

    def evaluating(self) -> None:
        """The epoch's evaluation starts: the items from here on are its own (in its order)."""
        self.marks.append(self._lengths())
        self.calls.append([0] * len(self.replicas))

    def count(self, model: nn.Module) -> None:
        """A step called on ``model`` (a copy, or its compiled wrapper; on that device's thread)."""
        i = self.index.get(id(model._modules.get("_orig_mod", model)))
        if i is not None:
            self.calls[-1][i] += 1

    def gather(self, logged: Set[str]) -> None:
        """Into the module's lists, every copy's items since ``start``; the metric objects not
        ``logged`` (the paths of those the steps log, which the figures merge) into the module's."""
        lists = [dict(held_lists(r, False)) for r in self.replicas]
        for key, mine in lists[0].items():
            copies = [each.get(key) for each in lists]
            if any(c is None for c in copies) or len({id(c) for c in copies}) < len(copies):
                continue            # (a list the copies share, or one only some hold: left as it is)
            items: List[Any] = []
            for mark, end, calls in zip(self.marks, self.marks[1:] + [None], self.calls):
                news = [c[min(mark[k].get(key, 0), len(c)):len(c) if end is None else end[k].get(key, len(c))]
                        for k, c in enumerate(copies)]
                items.extend(interleaved(news, calls))
            for c, at in zip(copies, self.marks[0]):
                del c[min(at.get(key, 0), len(c)):]
            mine.extend(items)
        for path, metric in metric_objects(self.replicas[0]):
            if path in logged:
                continue
            others = [replica.get_submodule(path) for replica in self.replicas[1:]]
            merge_into(metric, others, self.device)
            for other in others:
                other.reset()
            if hasattr(metric, "_computed"):
                metric._computed = None
