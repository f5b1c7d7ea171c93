"""Evaluation of a Task's model on the devices of one process: sums, never averages.

The loss, its denominator, correct predictions (classification) and every metric's
``(sum, count)`` are summed per device and then over devices; the loop sums them over
processes and divides once, so the figures do not depend on how the set was split. Metric
objects (torchmetrics) are updated per shard and computed over the whole set
(``stateful_metrics.py``).
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from ..core.parts import even_parts
from ..data.batch import Batch, batch_size, input_and_target, split_structure, to_device
from .losses import add_counts, loss_input
from .stateful_metrics import COMPUTED, pair_metric_names

Totals = Dict[str, torch.Tensor]


def evaluate(engine, batches) -> Totals:
    """Sum the loss, its denominator, correct predictions (classification) and every metric's
    ``(sum, count)`` over ``batches``, split across the devices; in eval mode, without
    gradients. Sums stay on the devices until the end: one wait, not one per batch."""
    metrics = {name: engine.task.metrics[name] for name in pair_metric_names(engine.task.metrics)}
    stateful = engine.stateful
    totals: List[Dict[str, Any]] = [{} for _ in engine.devices]

    def shard_totals(i: int, shard: Batch) -> None:
        if shard is None:
            return
        net, out, device = engine._net(i), totals[i], engine.devices[i]
        shard = to_device(shard, device, engine.memory_format)
        if engine.adapter is None:
            value, count, output = engine._loss_and_output(net, shard, device)
            _accumulate(out, "loss", value)
            _accumulate(out, "count", batch_size(shard) if count is None else count)
            if not engine.task.metrics:
                return
            if engine.task.forward is None:
                if output is None:
                    raise ValueError("metrics need outputs and targets: let step return a dict with 'loss' and "
                                     "'logits' (a Hugging Face model's output does), or also give "
                                     "forward=fn(model, batch) -> (output, target)")
                target = input_and_target(shard)[1]
        if engine.adapter is not None or engine.task.forward is not None:
            with engine._autocast(device):
                output, target = engine.forward(net, shard)
        if engine.adapter is not None:
            value, count = engine.adapter.measure(output, target, shard)
            _accumulate(out, "loss", value)
            _accumulate(out, "count", batch_size(shard) if count is None else count)
            hits = engine.adapter.correct(loss_input(output), target)
            if hits is not None:
                _accumulate(out, "correct", hits[0])
                _accumulate(out, "correct_count", hits[1])
        output = loss_input(output)
        if stateful:
            stateful.update(i, output, target)
        for name, fn in metrics.items():
            pair = fn(output, target)
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"metric {name!r} returned {type(pair).__name__}; a metric returns (sum, count), "
                                f"e.g. ((output - target).abs().sum(), target.numel())")
            value, count = pair
            _accumulate(out, name, value)
            _accumulate(out, f"{name}_count", count)

    was_training = [m.training for m in engine.replicas]
    stateful.reset()
    engine.replicas.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                n = batch_size(batch)
                k = min(n, len(engine.devices))
                if k == 0:
                    continue
                shards = split_structure(batch, even_parts(n, k))
                engine.runner.map(shard_totals, shards + [None] * (len(engine.devices) - k))
    finally:
        for m, mode in zip(engine.replicas, was_training):
            m.train(mode)
    out: Dict[str, Any] = {}
    for part in totals:
        for key, value in part.items():
            _accumulate(out, key, value.to(engine.devices[0]) if isinstance(value, torch.Tensor) else value)
    totals = {k: torch.as_tensor(v, dtype=torch.float64, device=engine.devices[0]) for k, v in out.items()}
    if stateful:        # over the whole set: merged over devices, gathered over processes
        totals[COMPUTED] = stateful.compute()
    return totals



def _accumulate(out: Dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().double()
    out[key] = value if key not in out else add_counts(out[key], value)
