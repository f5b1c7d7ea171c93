"""Evaluation of a Task's model on the devices of one process: sums, never averages.

The loss, its denominator, correct predictions (classification) and every metric's
``(sum, count)`` (several optimizers taking turns: each one's step's loss) are summed per
device and then over devices; the loop sums them over
processes and divides once, so the figures do not depend on how the set was split. Metric
objects (torchmetrics) are updated per shard and computed over the whole set
(``stateful_metrics.py``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..core.parts import even_parts
from ..core.modes import evaluating
from ..data.batch import Batch, batch_size, needs_move, split_structure, to_device
from ..data.model_inputs import target_of
from .class_counts import LazyCount, class_count_total
from .lightning_log import Logged
from .lightning_module import LightningSteps
from .model_outputs import output_for
from .sample_weights import split_weights
from .stateful_metrics import COMPUTED, StatefulMetrics, pair_metric_names, raised_by

Totals = Dict[str, torch.Tensor]


def sum_keys(engine) -> List[str]:
    """The sums ``evaluate`` gives, in one order, the same in every process (for one
    ``all_reduce``); with several optimizers taking turns, each update's loss too."""
    return ["loss", "count"] + figure_keys(engine) + update_keys(engine.task.updates)


def update_keys(updates) -> List[str]:
    """Several optimizers' losses as ``(sum, count)`` figures: ``<name>_loss`` and its count."""
    return [k for name in updates for k in (f"{name}_loss", f"{name}_loss_count")]


def figure_keys(engine) -> List[str]:
    """The sums behind the figures besides the loss, in one order: correct predictions
    (classification), then each ``(sum, count)`` metric's (training's figures too)."""
    keys = ["correct", "correct_count"] if engine.classification else []
    return keys + [k for name in pair_metric_names(engine.task.metrics) for k in (name, f"{name}_count")]


def try_metrics(engine, batch: Batch) -> None:
    """The metric objects on one evaluation batch, before training, on copies of them and
    without computing over a set: one that does not take the model's output (a binary
    torchmetrics object given a 3-class model's scores) fails now, not after an epoch of training.
    (A function of yours is not called before the run: it may read the run's state, or keep
    what it is given. A LightningModule's metrics are its steps', tried with them.)"""
    trial = StatefulMetrics(engine.task.metrics, engine.devices)
    if trial and not isinstance(engine.task.step, LightningSteps):
        evaluate(engine, [batch], trial)


def evaluate(engine, batches, trial: Optional[StatefulMetrics] = None) -> Totals:
    """Sum the loss, its denominator, correct predictions (classification) and every metric's
    ``(sum, count)`` over ``batches``, split across the devices; in eval mode, without
    gradients. Sums stay on the devices until the end: one wait, not one per batch.

    A batch's Python is what a small model's evaluation spends beyond the plain loop's: what
    is the same for every batch is looked up once, here, not per batch (session 16: the
    text classifier's bookkeeping took 37-45 us of a ~200 us batch, CPU time). ``trial``: copies
    of the metric objects to update instead, the only metrics used, none computed (``try_metrics``)."""
    metrics = {name: engine.task.metrics[name] for name in pair_metric_names(engine.task.metrics)} \
        if trial is None else {}
    stateful = engine.stateful if trial is None else trial
    adapter, forward, own_forward = engine.adapter, engine.forward, engine.task.forward is not None
    needs_output = bool(engine.task.metrics)
    # A LightningModule's logged figures alone (no metric reads the output): its step's output
    # (the figures it logged) goes to them as it is, not through output_for (a map over it: ~10 us a batch)
    logged_only = isinstance(engine.task.step, LightningSteps) and not stateful and \
        all(isinstance(m, Logged) for m in metrics.values())
    updates = engine.task.updates           # several optimizers: each one's step gives a loss
    keys_of = {name: (f"{name}_loss", f"{name}_loss_count") for name in updates or ()}
    totals: List[Dict[str, Any]] = [{} for _ in engine.devices]
    moves: List[Optional[bool]] = [None] * len(engine.devices)

    gathering = engine.evaluation_gathering      # a whole_batch loss's, over this process's devices
    # Keras's sample_weight (dptrain.evaluate's, fit's validation_data=(x, y, w)): the batches carry them
    weighs = getattr(batches, "weighs", False)

    def shard_totals(i: int, shard: Batch) -> None:
        if shard is None:
            if gathering is not None:
                gathering.idle(i)
            return
        net, out, device = engine._net(i), totals[i], engine.devices[i]
        move = moves[i]
        if move is None:        # (decided on the first batch: a loader's batches are alike)
            move = moves[i] = needs_move(shard, device, engine.memory_format)
        if move:
            shard = to_device(shard, device, engine.memory_format)
        weights = None
        if weighs:
            shard, weights = split_weights(shard)
        if updates:         # several optimizers: each step's loss; metrics score forward's output
            size = batch_size(shard)        # (once a shard, not once a step)
            for name, step in updates.items():
                value, count, _, mean = engine.steps.loss(net, shard, engine._autocast(device), step, size)
                accumulate(out, keys_of[name][0], value, count if mean else None)
                accumulate(out, keys_of[name][1], size if count is None else count)
            if not needs_output:
                return
        elif adapter is None:
            value, count, output, mean = engine.steps.loss(net, shard, engine._autocast(device))
            accumulate(out, "loss", value, count if mean else None)
            accumulate(out, "count", batch_size(shard) if count is None else count)
            if not needs_output:
                return
            if not own_forward:
                if output is None:
                    raise ValueError("metrics need outputs and targets: let step return a dict with 'loss' and "
                                     "'logits' (a Hugging Face model's output does), or also give "
                                     "forward=fn(model, batch) -> (output, target)")
                target = target_of(shard)
        if adapter is not None or own_forward or updates:
            with engine._autocast(device):
                output, target = forward(net, shard)
        if not logged_only:
            output = output_for(adapter, output)
        if adapter is not None:
            if weights is not None:
                value = adapter.weighed(output, target, weights)
            elif gathering is None:
                value = adapter(output, target, shard)
            else:
                with gathering.part(i):
                    value = adapter(output, target, shard)
            if type(value) is tuple:        # (a loss returning (sum, count) gave its own count)
                value, count = value
            else:
                count = adapter.lazy_count(target, output)
            accumulate(out, "loss", value)
            accumulate(out, "count", batch_size(shard) if count is None else count)
            hits = adapter.correct(output, target)
            if hits is not None:
                accumulate(out, "correct", hits[0])
                accumulate(out, "correct_count", hits[1])
        if stateful:
            stateful.update(i, output, target)
        for key, value in metric_pairs(metrics, output, target):
            accumulate(out, key, value)

    one = len(engine.devices) == 1         # no split, no hand-off to a device thread
    # Steps that draw numbers (a GAN's noise) on several CPU devices: in turn, in device
    # order, as training's forwards (``step_plan.Turns``), so the figures repeat run to run
    # (not known before a training step: in turn too); a model with forward hooks of the user's
    # too, so that each shard's step reads its own outputs (forward_hooks.py).
    in_turn = (bool(updates) and engine.random.draws is not False) or bool(engine.hooked)
    stateful.reset()
    steps = engine.task.step if isinstance(engine.task.step, LightningSteps) else None     # (a LightningModule's)
    if steps is not None:
        steps.validated.reset(engine.replicas)
    around = steps.eval_callbacks if steps is not None and trial is None else None    # (Lightning callbacks')
    with evaluating(*engine.replicas), torch.no_grad():     # each module's mode back after (a frozen BN stays)
        for index, batch in enumerate(batches):
            if steps is not None:
                steps.at(index)             # (its batch_idx)
                if steps.before is not None:    # (its on_before_batch_transfer)
                    batch = steps.loaded(batch, steps.eval_stage)
            if around is not None:
                around.start(batch, index)
            if one:
                shard_totals(0, batch)
                if around is not None:
                    around.end([engine._net(0)], [batch_size(batch)], batch, index)
                continue
            n = batch_size(batch)
            k = min(n, len(engine.devices))
            if k == 0:
                continue
            sizes = even_parts(n, k)
            shards = split_structure(batch, sizes)
            if in_turn:
                for i, shard in enumerate(shards):
                    shard_totals(i, shard)
            else:
                engine.runner.map(shard_totals if gathering is None else gathering.guarded(shard_totals),
                                  shards + [None] * (len(engine.devices) - k))
            if around is not None:
                around.end([engine._net(i) for i in range(k)], sizes, batch, index)
    totals = over_devices(totals, engine.devices)
    if stateful and trial is None:      # over the whole set: merged over devices, gathered over processes
        totals[COMPUTED] = stateful.compute()
    if steps is not None and steps.validated.paths:         # a LightningModule's own, alike
        totals.setdefault(COMPUTED, {}).update(steps.validated.computed(list(engine.replicas), engine.devices,
                                                                        stateful.alone))
    return totals


def metric_pairs(metrics: Dict[str, Any], output: Any, target: Any) -> List[Tuple[str, Any]]:
    """Each ``(sum, count)`` metric's figures for one shard: ``[(name, sum), (name_count,
    count), ...]``."""
    figures = []
    for name, fn in metrics.items():
        try:
            pair = fn(output, target)
        except Exception as e:
            raised_by(e, name, fn, output, target)
            raise
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"metric {name!r} returned {type(pair).__name__}; a metric returns (sum, count), "
                            f"e.g. ((output - target).abs().sum(), target.numel())")
        figures += [(name, pair[0]), (f"{name}_count", pair[1])]
    return figures


def over_devices(totals: List[Dict[str, Any]], devices: Sequence[torch.device]) -> Totals:
    """Each figure's float64 sum over the devices' kept values, on the first device."""
    out: Totals = {}
    for part, device in zip(totals, devices):
        for key, values in part.items():
            total = sum_values(values, device).to(devices[0])
            out[key] = total if key not in out else out[key] + total
    return out


#: Values of a figure kept before they are summed (a LazyCount holds its batch's targets).
FOLD_EVERY = 64


class _Kept(list):
    """One figure's values on one device: CPU numbers (0-d tensors and Python numbers) are
    added into ``host`` (a Python number: a float is a float64, an int is exact) as they
    come; GPU tensors and ``LazyCount``s are kept and summed every ``FOLD_EVERY``."""
    host: Any = 0


def accumulate(out: Dict[str, _Kept], key: str, value: Any, times: Optional[int] = None) -> None:
    """Add ``value`` (times ``times`` if given: a mean loss by its count) to figure ``key``. A CPU
    tensor is read (``item``: 0.2 us) and added as a Python number: a float64 tensor's ``add_``
    of a float32 or int64 number took 1.9 us (1 us of it the type promotion), and a batch's
    kept tensors sat between the next batch's large temporaries (the text classifier's
    evaluation ran 12-17% slower with them kept, session 15); a mean's product is taken on the
    host too, in float64 (a tensor's multiplication was 2-3 us a step, session 31). On a GPU
    each add is a kernel launch and a read waits for the device: kept, and summed in a few
    operations (``sum_values``)."""
    values = out.get(key)
    if values is None:
        values = out[key] = _Kept()
    kind = type(value)
    if kind is torch.Tensor and value.is_cpu and value.ndim == 0:
        values.host += value.item() if times is None else value.item() * times
        return
    if kind is float or kind is int:
        values.host += value if times is None else value * times
        return
    values.append(value if times is None else value * times)
    if len(values) >= FOLD_EVERY:
        folded = out[key] = _Kept([sum_values(list(values))])
        folded.host = values.host


def sum_values(values: List[Any], device: Optional[torch.device] = None) -> torch.Tensor:
    """The float64 sum of one figure's values on ``device`` (None: where its first tensor
    is), in a few operations (not two or three per batch: on a GPU each costs host time, on
    a CPU a small batch's evaluation was 20% bookkeeping)."""
    host = getattr(values, "host", 0)
    if device is None:
        first = next((v for v in values if isinstance(v, (torch.Tensor, LazyCount))), None)
        device = first.device if isinstance(first, torch.Tensor) else \
            first.target.device if first is not None else torch.device("cpu")
    number = host + sum(float(v) for v in values if not isinstance(v, (torch.Tensor, LazyCount)))
    total = torch.tensor(number, dtype=torch.float64, device=device)
    if not values:          # (CPU figures: summed as they came)
        return total
    tensors = [v.detach().reshape(()) for v in values if isinstance(v, torch.Tensor)]
    lazy = [v for v in values if isinstance(v, LazyCount)]
    by_kind: Dict[Any, List[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    for group in by_kind.values():
        total = total + torch.stack(group).to(device, torch.float64).sum()
    if lazy:
        total = total + class_count_total(lazy).to(device)
    return total
