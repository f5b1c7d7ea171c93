"""A model that computes its own loss from the batch's ``labels`` (a Hugging Face model): the
loss dptrain computes in its place must be the same one.

By default a dict batch's ``labels`` are held back, the model gives its logits, and dptrain
compares them with the labels itself, so that the loss sums exactly over devices and
processes (``losses.py``). That is the model's own loss only where its loss is
cross-entropy of each position's logits against that position's label. A causal language
model's (``GPT2LMHeadModel``, any ``...ForCausalLM``) compares position ``t``'s logits with
the label at ``t + 1``: compared in place, it learned to copy its input, silently. So before
training, ``check_own_loss`` asks the model for its loss on one labelled token of the first
sample and compares it with both readings of the logits:

- position ``t``'s: nothing to change;
- position ``t - 1``'s (a causal LM): the labels are shifted for the loss and the accuracy
  (``next_token``: ``labels[:, t + 1]`` at ``t``, the last position ignored, as the model's
  own loss shifts them), still exact over devices; the metrics get logits and labels as the
  model and the batch give them (a Hugging Face ``compute_metrics`` shifts them itself);
- neither (a loss with more in it: label smoothing, a mixture of experts' balancing term):
  an error naming ``step=`` (the model's own loss) and ``loss=`` (one of your choosing).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..core.modes import evaluating
from ..data.batch import to_device
from .model_outputs import loss_input

IGNORE_INDEX = -100     # (cross-entropy's default, which a Hugging Face model's loss uses)


def next_token(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``labels`` shifted for a causal LM's loss: position ``t`` holds the label at ``t + 1``,
    the last position ``ignore_index`` (the same shape, so shards and counts stay as they are)."""
    return F.pad(labels[..., 1:], (0, 1), value=ignore_index)


def takes_labels(model: Any) -> bool:
    """Whether ``model``'s forward takes ``labels=`` (by name, or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(getattr(model, "forward", model)).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "labels" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _own_loss(output: Any) -> Optional[torch.Tensor]:
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 and torch.isfinite(loss).all() else None


def check_own_loss(engine: Any, example: Any) -> Optional[str]:
    """Compare the model's own loss with the one dptrain computes in its place, on one token
    of ``example`` (a training batch; see the module). Returns the line to say when the
    labels are now shifted (a causal LM), None when nothing changes; raises when the two
    losses differ otherwise. Checked only where dptrain chose the loss: no ``loss=``,
    ``forward=`` or ``step=`` given, a dict batch with integer ``labels`` the forward takes."""
    task, adapter = engine.task, engine.adapter
    if adapter is None or task.loss is not None or task.forward is not None or not isinstance(example, Mapping):
        return None
    labels = example.get("labels")
    if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.dim() < 2 \
            or not takes_labels(engine.replicas[0]):
        return None
    kept = (labels[0] != IGNORE_INDEX).reshape(-1, labels.shape[-1])[0].nonzero()
    if len(kept) == 0 or int(kept[-1]) < 1:
        return None             # (no labelled token after the first: nothing to tell the readings apart)
    t = int(kept[-1])
    probe = torch.full_like(labels, IGNORE_INDEX)
    probe.reshape(-1, labels.shape[-1])[0, t] = labels.reshape(-1, labels.shape[-1])[0, t]
    net, device = engine.replicas[0], engine.devices[0]
    inputs = to_device({**{k: v for k, v in example.items() if k != "labels"}, "labels": probe}, device)
    with evaluating(net), torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        output = net(**inputs)
    own, logits = _own_loss(output), loss_input(output, whole=True)
    if own is None or not isinstance(logits, torch.Tensor) or tuple(logits.shape[:-1]) != tuple(labels.shape):
        return None
    scores = -torch.log_softmax(logits.reshape(-1, labels.shape[-1], logits.shape[-1])[0].double(), -1)
    label = int(probe.reshape(-1, labels.shape[-1])[0, t])
    own_value, here, before = float(own), float(scores[t, label]), float(scores[t - 1, label])
    tolerance = 1e-4 * max(1.0, abs(own_value))
    if abs(own_value - here) <= tolerance:
        return None
    name = type(net).__name__
    if abs(own_value - before) <= tolerance:
        adapter.shift_labels = True
        return (f"dptrain: {name} computes its loss on the next token (a causal language model's: labels[:, t + 1] "
                f"against logits[:, t]), so the loss and the accuracy read the labels shifted, as its own loss "
                f"does; the metrics get the logits and labels as they are")
    raise ValueError(f"{name}'s own loss on one labelled token of the first sample is {own_value:.6g}, but "
                     f"cross-entropy of its logits against the labels (what dptrain computes in its place, to sum the "
                     f"loss exactly over devices) is {here:.6g} there ({before:.6g} against the next token): its loss "
                     f"is another one (label smoothing, an auxiliary term). Pass step=lambda model, batch: "
                     f"model(**batch) to train on the model's own loss (a mean over each device's samples), or "
                     f"loss=fn(output, labels) for one of your choosing")
