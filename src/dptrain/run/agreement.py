"""What every process of a job must agree on, checked once the group has formed, before any batch.

A launched script or recipe runs once per process; if one process builds another model,
optimizer, learning rate, batch size or dataset (a rank-dependent branch, a different file
on one machine), the processes would train on with weights that drift apart, or abort deep
in a collective blaming a healthy rank. Instead each process describes its run in a few
strings, the descriptions are gathered (one ``all_gather_object``), and any difference is one
line naming the setting and what each rank has, before the model is broadcast.
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..engine.task import Task
from ..parallel.combined import CombinedOptimizer
from .config import TrainConfig


def describe_model(model: nn.Module) -> str:
    """Parameter and buffer names with their shapes and dtypes (first difference is what shows)."""
    parts = []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        shape = "lazy" if is_lazy(t) else "x".join(map(str, t.shape)) or "scalar"
        parts.append(f"{name} {shape} {str(t.dtype).replace('torch.', '')}")
    return f"{type(model).__name__}: " + ", ".join(parts)


def describe_callable(spec: Any) -> str:
    """A loss, optimizer or scheduler spec: its kind and settings, without addresses."""
    if spec is None or isinstance(spec, str):
        return str(spec)
    if isinstance(spec, dict):                  # several optimizers: one per update name
        return "{" + ", ".join(f"{k}: {describe_callable(v)}" for k, v in spec.items()) + "}"
    if isinstance(spec, CombinedOptimizer):
        return "combined" + describe_callable(spec.optimizers)
    if isinstance(spec, torch.optim.Optimizer):
        return f"{type(spec).__name__}({spec.defaults})"
    func = getattr(spec, "func", None)          # functools.partial
    if func is not None:
        return f"{getattr(func, '__qualname__', type(func).__name__)}({spec.args}, {spec.keywords})"
    if isinstance(spec, nn.Module):
        return f"{type(spec).__name__}({spec.extra_repr()}, reduction={getattr(spec, 'reduction', None)})"
    return getattr(spec, "__qualname__", type(spec).__name__)


def fingerprint(loader: Any) -> str:
    """The samples of a loader: how many, and for tensors in memory a hash of the first and
    last sample (cheap; catches another file or another order of the rows); for a stream, a
    hash of its first sample."""
    if loader is None:
        return "none"
    text = f"{loader.size} samples"
    data = getattr(loader, "data", None)
    stream = getattr(loader, "stream", False)
    if getattr(loader, "sharded", False):       # each process's its own share (sharded_stream)
        return f"a stream sharded by process, {loader.size} samples an epoch"
    if stream:          # its first sample: a stream sharded by rank differs there
        text, data = f"a stream of {loader.size or 'unknown'} samples an epoch", loader.example()
    if data is not None:
        tensors = list(data.values()) if isinstance(data, dict) else list(data) if isinstance(data, (tuple, list)) \
            else [data]
        digest = hashlib.sha1()
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.shape[0]:
                for row in (t[0], t[-1]):
                    row = row.to_dense() if row.layout != torch.strided else row      # (a sparse matrix's rows)
                    # (as bytes: NumPy has no bfloat16; a fresh copy, as a NumPy column y[:, None] of
                    # stride 0 is "contiguous" to torch, and its view as bytes was an error)
                    row = row.detach().cpu().reshape(-1).clone(memory_format=torch.contiguous_format)
                    digest.update(row.view(torch.uint8).numpy().tobytes())
        text += f", {'its first sample' if stream else 'content'} {digest.hexdigest()[:12]}"
    return text


def describe_settings(task: Task, config: TrainConfig, epochs: Optional[int], batch_size: int,
                      lr: Optional[float]) -> Dict[str, str]:
    """The settings that must be equal in every process, as strings (before the model is
    broadcast: another architecture is named here, not in a collective's abort)."""
    return {
        "model": describe_model(task.model),
        "optimizer": describe_callable(task.optimizer) + (f" {task.optimizer_params}" if task.optimizer_params else ""),
        "learning rate": repr(lr),
        "loss": describe_callable(task.loss if task.step is None else task.step),
        "scheduler": describe_callable(task.scheduler),
        "global batch size": repr(batch_size),
        "epochs": repr(epochs),
        "seed": repr(config.seed),
        **{name: repr(getattr(config, name)) for name in (
            "max_batches", "steps_per_epoch", "max_steps", "max_time", "log_every_n_steps", "eval_every_n_steps", "eval_batches",
            "accumulate_grad_batches", "clip_grad_norm", "clip_grad_value", "on_nan", "train_metrics", "eval_every",
            "validation_split", "shuffle", "sync_batchnorm", "amp", "resume", "dispatch_batches", "sharded_stream")},
    }


def describe_data(train_loader: Any, eval_loader: Any, others: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    """The data every process must hold (each reads its own part of every batch)."""
    evaluations = {"test": eval_loader, **(others or {})}
    return {"training data": fingerprint(train_loader), "evaluation data": fingerprint(eval_loader),
            **{f"evaluation set {name!r}": fingerprint(loader) for name, loader in (others or {}).items()},
            # (another batch: another number of evaluation steps, each with its collectives)
            "evaluation batch size": repr([getattr(loader, "batch_size", None) for loader in evaluations.values()
                                           if loader is not None])}


def what_it_trains(task: Task, train_loader: Any) -> Dict[str, str]:
    """What a checkpoint's run trained, which a resumed run must train too: the model's
    structure, the loss and the training data (see ``fingerprint``; the optimizer's class is
    checked with its state, ``parallel/optim.py``)."""
    return {"model": describe_model(task.model), "loss": loss_identity(task), "training data": fingerprint(train_loader)}


def loss_identity(task: Task) -> str:
    """The loss as a resumed run must match it: a torch loss by kind and settings; the user's
    own function or ``step`` only as such (renaming or rewriting one is allowed)."""
    if task.several:
        return f"your step functions ({', '.join(task.updates)})"
    if task.step is not None:
        return "your step function"
    loss = task.loss
    if loss is None or isinstance(loss, nn.Module) or str(getattr(loss, "__module__", "")).startswith("torch"):
        return describe_callable(loss)
    return "your loss function"


def check_agreement(collective: Any, rank: int, mine: Dict[str, str]) -> None:
    """Gather every process's description; a difference is a ``ValueError`` naming the setting
    and what each rank has (the same error in every process)."""
    if collective.world_size == 1:
        return
    everyone: List[Dict[str, str]] = collective.all_gather_object(mine)
    for key, value in mine.items():
        values = [d.get(key) for d in everyone]
        if len(set(values)) > 1:
            odd = next(r for r, v in enumerate(values) if v != values[0])
            first, other = around_difference(values[0], values[odd]), around_difference(values[odd], values[0])
            if str(values[0]).startswith("a stream"):
                stream = " (every process reads a stream whole, keeping its part of each batch: do not shard it by " \
                         "rank, or pass sharded_stream=True if each process's stream is its own share)"
            elif "data" in key:
                stream = " (dptrain gives each process its part of every batch itself: give every process the whole " \
                         "set, with no DistributedSampler or slicing by rank, and seed random data alike)"
            else:
                stream = ""
            raise ValueError(f"the processes disagree on the {key}: rank 0 has {first}, rank {odd} has {other}{stream}. "
                             f"Every process must run the same program on the same data (check for settings that "
                             f"depend on the rank or the machine)")


def around_difference(text: Optional[str], other: Optional[str], width: int = 120) -> str:
    """``text`` around its first difference from ``other``, at most ``width`` characters."""
    if text is None or len(text) <= width:
        return str(text)
    at = next((i for i, (a, b) in enumerate(zip(text, other or "")) if a != b), min(len(text), len(other or "")))
    start = max(0, at - width // 2)
    return ("..." if start else "") + text[start:start + width] + ("..." if start + width < len(text) else "")
