"""Figures of the training batches (``train_metrics=True``): accuracy and the ``(sum, count)``
metrics on what each step's forward pass computed, summed as the loss is.

Keras reports a metric on the training batches as they are trained (``accuracy`` beside
``val_accuracy``), Lightning logs ``train_acc`` from ``training_step``: each batch is scored
by the weights of its own step, in training mode, with no second forward pass. Here each
device adds its shard's hits (or metric sums) and counts, the process adds its devices', the
loop adds the processes' with the loss (one ``all_reduce`` an epoch) and divides once: the
epoch's ``train_acc`` is the plain loop's on one device over the same batches. A step that
did not update (``on_nan="skip"``) is left out, as its loss is.

Metric objects (torchmetrics: F1, AUC...) get a copy per device, updated with the shards of
every step that updated, merged and computed over every process at the epoch's end, as the
evaluation's are. A mid-epoch checkpoint holds each process's merged state (``states``; with
those a LightningModule's ``training_step`` logs: ``saved`` on resume, taken back at the
epoch's reset); without it (an older checkpoint, a metric that cannot merge states) an epoch
resumed mid-way gives them NaN, never a figure of part of the epoch as the whole's.

>>> figures = TrainFigures(engine)      # engine.train_figures: the engine adds each shard
>>> figures.add(i, output, target)      # on device i's thread, after its forward
>>> figures.end_step(stepped=True)      # the step's shards count (or not)
>>> figures.totals()                    # {"correct": ..., "correct_count": ...}: float64, first device
>>> figures.computed()                  # {"f1": 0.83}: the metric objects, over the epoch
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..data.batch import Batch, map_tensors
from ..data.model_inputs import target_of
from .evaluation import Totals, figure_keys, metric_pairs, over_devices, sum_values, update_keys
from .lightning_log import StepLogs
from .lightning_module import LightningSteps
from .model_outputs import output_for
from .stateful_metrics import StatefulMetrics, pair_metric_names


#: A shard's ``(arg-max, target)``, compared with many others' in ``_fold``.
PREDICTED = "predicted"
#: How the keys of what a LightningModule's ``training_step`` logs begin.
LOGGED = "logged:"


def logged_figures(sums: Dict[str, float]) -> Dict[str, float]:
    """``train_<name>`` for each figure a ``training_step`` logged: its sum over its count
    (NaN over none)."""
    return {f"train_{key[len(LOGGED):]}": value / sums[f"{key}_count"] if sums[f"{key}_count"] else math.nan
            for key, value in sums.items() if key.startswith(LOGGED) and f"{key}_count" in sums}


class TrainFigures:
    """See the module docstring. ``partial``: the epoch was resumed mid-way (the metric
    objects then give NaN). ``score``: the shards are scored (``train_metrics``); without,
    only the sums given (several optimizers' losses, ``add_sums``) are kept."""

    #: Steps whose values are kept before they are summed in a few operations.
    FOLD_EVERY = 32

    def __init__(self, engine: Any, score: bool = True):
        self.engine = engine
        # (several optimizers: each update's loss, as a (sum, count) figure: updates.py)
        self.keys = (figure_keys(engine) if score else []) + update_keys(engine.task.updates)
        scored = engine.task.metrics if score else {}
        self.metrics = {name: scored[name] for name in pair_metric_names(scored)}
        self.own_forward = engine.task.forward is not None
        n = len(engine.devices)
        self._step: List[List[Tuple[str, Any]]] = [[] for _ in range(n)]    # this step's, per device
        self._kept: List[List[Tuple[str, Any]]] = [[] for _ in range(n)]    # the epoch's, per device
        self._steps = 0
        self.objects = StatefulMetrics(scored, engine.devices)    # a copy per device
        self._updates: List[List[Tuple[Any, Any]]] = [[] for _ in range(n)]    # this step's, for them
        self.partial = False
        self.saved: Optional[List[Dict[str, Any]]] = None   # the metric objects' states a checkpoint gave
        self.logged: Optional[StepLogs] = None               # what a LightningModule's training_step logs

    def add_logged(self, logs: StepLogs) -> None:
        """Keep the numbers ``logs`` (a ``training_step``'s ``self.log``) names, each a
        ``(sum, count)`` figure ``logged:<name>`` (``logged_figures`` reads them), and compute
        the metric objects it logs over the epoch (each replica's copy, merged)."""
        self.logged = logs
        self.keys += [k for name in logs.names or () for k in (f"{LOGGED}{name}", f"{LOGGED}{name}_count")]
        self._stateful()        # (a metric object that cannot merge its device copies: said now, not after an epoch)

    def add(self, i: int, output: Any, target: Any) -> None:
        """Score device ``i``'s shard: ``output`` as its forward gave it, ``target`` its target.
        What it costs a step is kept small (a tiny MLP's step is ~280 us): a step keeps its
        arg-max predictions and targets, compared and summed every ``FOLD_EVERY`` steps (the
        comparison and sum a step took 18 us more, in the loop, than the arg-max alone)."""
        adapter = self.engine.adapter
        output = output_for(adapter, output)
        output = output.detach() if isinstance(output, torch.Tensor) else map_tensors(torch.Tensor.detach, output)
        step = self._step[i]
        if self.metrics:
            with torch.no_grad():
                step += metric_pairs(self.metrics, output, target)
        if self.objects:        # (updated once the step is known to have updated)
            self._updates[i].append((output, target))
        if adapter is not None and adapter.classification:
            if target.is_floating_point():      # class probabilities (rare): counted now
                hits, count = adapter.correct(output, target)
                step += [("correct", hits), ("correct_count", count)]
            else:           # compared with the targets later, many steps at once (a token classifier's
                # classes last; a causal LM's labels shifted, as its loss reads them)
                step.append((PREDICTED, (output.argmax(dim=-1 if adapter.classes_last else 1),
                                         adapter.read_target(target))))

    def add_sums(self, key: str, value: Any, count: Any) -> None:
        """A figure's sum and count for this step, as this process has them (on the first
        device): ``<key>`` and ``<key>_count``."""
        self._step[0] += [(key, value), (f"{key}_count", count)]

    def add_step_output(self, i: int, net: Any, shard: Batch, output: Any) -> None:
        """Score a shard trained by a ``step`` function: the logits it returned, else (with
        ``forward=``) a forward pass without gradients."""
        if self.logged is not None:         # (a batch's mean and its samples: summed at the fold)
            figures = self.logged.latest.get()
            for name in self.logged.names or ():
                if name in figures:
                    self._step[i] += [(f"{LOGGED}{name}", figures[name]), (f"{LOGGED}{name}_count", figures[name][1])]
        if not self.metrics and not self.objects:
            return
        if output is None:
            if not self.own_forward:
                raise ValueError("train_metrics need outputs and targets: let step return a dict with 'loss' and "
                                 "'logits' (a Hugging Face model's output does), or also give "
                                 "forward=fn(model, batch) -> (output, target)")
            with torch.no_grad(), self.engine._autocast(self.engine.devices[i]):
                output, target = self.engine.forward(net, shard)
        else:
            target = target_of(shard)
        self.add(i, output, target)

    def end_step(self, stepped: bool) -> None:
        """The step is over: its shards' figures count if it ``stepped``, else are dropped."""
        for i, part in enumerate(self._step):
            if not part:
                continue
            if stepped:
                self._kept[i] += part
            part.clear()
        for i, updates in enumerate(self._updates):
            if stepped:
                for output, target in updates:
                    self.objects.update(i, output, target)
            updates.clear()
        if stepped:
            self._steps += 1
            if self._steps % self.FOLD_EVERY == 0:
                for i in range(len(self._kept)):
                    self._fold(i)

    def _fold(self, i: int) -> None:
        """Sum device ``i``'s kept values: one float64 tensor per figure."""
        grouped = _by_key(self._kept[i])
        predicted = grouped.pop(PREDICTED, None)
        if predicted:
            hits, count = self._compare(predicted)
            grouped.setdefault("correct", []).append(hits)
            grouped.setdefault("correct_count", []).append(count)
        device = self.engine.devices[i]
        self._kept[i][:] = [(key, _weighted(values, device) if key.startswith(LOGGED) and not key.endswith("_count")
                             else sum_values(values, device)) for key, values in grouped.items()]

    def _compare(self, predicted: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Correct predictions and their count over many shards' ``(arg-max, target)``: the
        targets that are ``ignore_index`` are neither (as ``LossAdapter.correct``)."""
        guesses = torch.cat([g.reshape(-1) for g, _ in predicted])
        targets = torch.cat([t.reshape(-1) for _, t in predicted])
        kept = targets != getattr(self.engine.adapter.loss, "ignore_index", -100)
        return ((guesses == targets) & kept).sum(dtype=torch.float64), kept.sum(dtype=torch.float64)

    def totals(self) -> Totals:
        """This process's sums since ``reset``, float64 on the first device (every key)."""
        devices = self.engine.devices
        for i in range(len(devices)):
            self._fold(i)
        out = over_devices([_by_key(kept) for kept in self._kept], devices)
        zero = torch.zeros((), dtype=torch.float64, device=devices[0])
        return {key: out.get(key, zero) for key in self.keys}

    def numbers(self) -> List[float]:
        """``totals`` as numbers, in ``keys``' order (for a mid-epoch checkpoint)."""
        totals = self.totals()
        return [float(totals[key]) for key in self.keys]

    def computed(self) -> Dict[str, Any]:
        """The metric objects' values over the epoch (every process calls it: they gather
        their states), NaN for an epoch resumed mid-way."""
        values = self.objects.compute() if self.objects else {}
        if self.logged is not None and self.logged.paths:
            values.update(self.logged.computed(list(self.engine.replicas), self.engine.devices, alone=False))
        return {name: math.nan for name in values} if self.partial else values

    def _stateful(self) -> List[StatefulMetrics]:
        """The metric objects whose states a mid-epoch checkpoint keeps: ``metrics=``'s, and the
        module's own that its ``training_step`` logs (each replica's copy, by row name: ``train_f1``)."""
        held = [self.objects] if self.objects else []
        if self.logged is not None and self.logged.paths:
            held.append(StatefulMetrics.of_copies(
                {f"train_{name}": [r.get_submodule(path) for r in self.engine.replicas]
                 for name, path in self.logged.paths.items()}, self.engine.devices))
        return held

    def stateful_names(self) -> List[str]:
        """The ``train_*`` figures of metric objects, which an epoch resumed without their
        saved states gives as NaN."""
        return [name if held is not self.objects else f"train_{name}" for held in self._stateful()
                for name in held.copies]

    def states(self) -> Dict[str, Dict[str, Any]]:
        """Every metric object's state in this process (devices merged), for a checkpoint."""
        return {name: state for held in self._stateful() for name, state in held.states().items()}

    def _load(self, saved: List[Dict[str, Any]]) -> bool:
        """Take the saved states back (one dict a saved process); whether every object could."""
        return all([held.load(saved) for held in self._stateful()])

    def reset(self, partial: bool = False) -> None:
        """From zero, for an epoch (``partial``: one resumed mid-way: the metric objects take
        the states its checkpoint saved, ``saved``, else give NaN)."""
        for part in self._step + self._kept + self._updates:
            part.clear()
        self._steps = 0
        self.objects.reset()
        if self.logged is not None:
            self.logged.reset(self.engine.replicas)
        if partial and self.saved is not None and self._load(self.saved):
            partial = False
        self.partial, self.saved = partial, None


def with_logged(engine: Any, figures: Optional[TrainFigures]) -> Optional[TrainFigures]:
    """``figures`` (or new ones, scoring nothing else) keeping what the engine's LightningModule's
    ``training_step`` logs, once its first call has named it; ``figures`` where it logs nothing."""
    logs = engine.task.step.trained if isinstance(engine.task.step, LightningSteps) else None
    if logs is None or not (logs.names or logs.paths):
        return figures
    figures = figures if figures is not None else TrainFigures(engine, score=False)
    figures.add_logged(logs)
    return figures


def _weighted(values: List[Any], device: torch.device) -> torch.Tensor:
    """A logged figure's sum: its ``(mean, n)`` pairs weighted in one product (a sum folded
    before is a tensor), float64 on ``device``."""
    pairs = [v for v in values if not isinstance(v, torch.Tensor)]
    total = torch.zeros((), dtype=torch.float64, device=device)
    if pairs:
        means = torch.stack([m.reshape(()).to(device, torch.float64) for m, _ in pairs])
        total = means @ torch.tensor([float(n) for _, n in pairs], dtype=torch.float64, device=device)
    for folded in values:
        if isinstance(folded, torch.Tensor):
            total = total + folded
    return total


def _by_key(kept: List[Tuple[str, Any]]) -> Dict[str, List[Any]]:
    grouped: Dict[str, List[Any]] = {}
    for key, value in kept:
        grouped.setdefault(key, []).append(value)
    return grouped
