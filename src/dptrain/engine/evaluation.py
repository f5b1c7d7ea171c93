"""Evaluation of a Task's model on the devices of one process: sums, never averages.

The loss, its denominator, correct predictions (classification) and every metric's
``(sum, count)`` are summed per device and then over devices; the loop sums them over
processes and divides once, so the figures do not depend on how the set was split.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from ..core.parts import even_parts
from ..data.batch import Batch, batch_size, split_structure, to_device
from .losses import add_counts

Totals = Dict[str, torch.Tensor]


def evaluate(engine, batches) -> Totals:
    """Sum the loss, its denominator, correct predictions (classification) and every metric's
    ``(sum, count)`` over ``batches``, split across the devices; in eval mode, without
    gradients. Sums stay on the devices until the end: one wait, not one per batch."""
    metrics = engine.task.metrics
    if metrics and engine.adapter is None and engine.task.forward is None:
        raise ValueError("metrics need outputs and targets: with a step function, also give "
                         "forward=fn(model, batch) -> (output, target)")
    totals: List[Dict[str, Any]] = [{} for _ in engine.devices]

    def shard_totals(i: int, shard: Batch) -> None:
        if shard is None:
            return
        net, out, device = engine._net(i), totals[i], engine.devices[i]
        shard = to_device(shard, device, engine.memory_format)
        if engine.adapter is None:
            value, count = engine._loss(net, shard, device)
            _accumulate(out, "loss", value)
            _accumulate(out, "count", batch_size(shard) if count is None else count)
            if engine.task.forward is None:
                return
        with engine._autocast(device):
            output, target = engine.forward(net, shard)
        if engine.adapter is not None:
            count = engine.adapter.count(target)
            _accumulate(out, "loss", engine.adapter(output, target))
            _accumulate(out, "count", batch_size(shard) if count is None else count)
            hits = engine.adapter.correct(output, target)
            if hits is not None:
                _accumulate(out, "correct", hits[0])
                _accumulate(out, "correct_count", hits[1])
        for name, fn in metrics.items():
            pair = fn(output, target)
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"metric {name!r} returned {type(pair).__name__}; a metric returns (sum, count), "
                                f"e.g. ((output - target).abs().sum(), target.numel())")
            value, count = pair
            _accumulate(out, name, value)
            _accumulate(out, f"{name}_count", count)

    was_training = [m.training for m in engine.replicas]
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
    return {k: torch.as_tensor(v, dtype=torch.float64, device=engine.devices[0]) for k, v in out.items()}



def _accumulate(out: Dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().double()
    out[key] = value if key not in out else add_counts(out[key], value)
