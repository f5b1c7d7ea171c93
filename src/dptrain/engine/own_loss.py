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

One token's loss is the same whether the model averages its tokens or sums them, so where the
sample has two labelled tokens it is asked once more, with two: its loss must be their mean,
as ours is (a sum over tokens, ``reduction="sum"``, is the same error: ours would train it at
another scale, silently).

A label per sample (a sequence classifier's) is compared on the first sample alike. Labels
that cross-entropy cannot take (a regression's floats, a multi-label classifier's rows of 0/1,
for which the model's own loss is MSE or binary cross-entropy by its config) train on the
model's own loss, as ``step=lambda model, batch: model(**batch)`` does (``model_loss``: a mean
over each device's samples, exact for a loss per sample), said in one line; they were an
error saying to pass ``loss=nn.MSELoss()``, which then failed on the logits' shape ``(N, 1)``.
So does a dict batch with no target key whose model computes its loss from it (a
question-answering model's start and end positions).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from ..core.modes import evaluating
from ..data.batch import to_device
from ..data.model_inputs import TARGET_KEYS
from ..parallel.replicas import is_lazy
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


def model_loss(model: Any, batch: Any) -> Any:
    """The step of a model that computes its own loss: ``model(**batch)``, labels and all."""
    return model(**batch)


def _own_loss(output: Any) -> Optional[torch.Tensor]:
    """The loss a model's output holds (a dict's or an object's ``loss``: one finite number), or None."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 and torch.isfinite(loss).all() else None


def check_own_loss(engine: Any, example: Any) -> Optional[str]:
    """Compare the model's own loss with the one dptrain computes in its place, on one token
    of ``example`` (a training batch; see the module). Returns the line to say when the
    labels are now shifted (a causal LM), None when nothing changes; raises when the two
    losses differ otherwise. Checked only where dptrain chose the loss: no ``loss=``,
    ``forward=`` or ``step=`` given, a dict batch with integer ``labels`` the forward takes."""
    task, adapter = engine.task, engine.adapter
    if adapter is None or task.loss is not None or task.forward is not None or not isinstance(example, Mapping) \
            or is_lazy(engine.replicas[0]):         # (lazy layers: shaped by the first batch, after this)
        return None
    if not any(k in example for k in TARGET_KEYS):
        return _no_target(engine, example)
    labels = example.get("labels")
    if not isinstance(labels, torch.Tensor) or labels.dim() < 1 or not takes_labels(engine.replicas[0]):
        return None
    if labels.dim() == 1 or labels.is_floating_point():
        return _per_sample(engine, example, labels)
    row = labels.reshape(-1, labels.shape[-1])[0]        # (the first sample's first sequence)
    kept = [int(t) for t in (row != IGNORE_INDEX).nonzero() if t >= 1]
    if not kept:
        return None             # (no labelled token after the first: nothing to tell the readings apart)
    first = _probe(engine, example, row, [kept[-1]])
    if first is None:
        return None
    # The token whose two readings differ most (a model's first scores may be close to even):
    # asked again there, the answer is clear in 16 bits too.
    scores = first[1]
    t = max(kept, key=lambda t: abs(float(scores[t, row[t]] - scores[t - 1, row[t]])))
    own_value, scores = _probe(engine, example, row, [t]) if t != kept[-1] else first
    here, before = float(scores[t, row[t]]), float(scores[t - 1, row[t]])
    off_here, off_before = abs(own_value - here), abs(own_value - before)
    name, tolerance = type(engine.replicas[0]).__name__, _tolerance(own_value, engine.replicas[0])
    shifted = off_here > off_before or off_here > tolerance
    if shifted and off_before > tolerance:
        raise _another(name, "one labelled token of ", own_value,
                       f"{here:.6g} there ({before:.6g} against the next token)")
    if len(kept) > 1:
        _check_mean(engine, example, row, [t, kept[0] if kept[0] != t else kept[1]], shifted, scores)
    if not shifted:
        return None
    adapter.shift_labels = True
    return (f"dptrain: {name} computes its loss on the next token (a causal language model's: labels[:, t + 1] "
            f"against logits[:, t]), so the loss and the accuracy read the labels shifted, as its own loss "
            f"does; the metrics get the logits and labels as they are")


def _check_mean(engine: Any, example: Any, row: torch.Tensor, two: list, shifted: bool, scores: torch.Tensor) -> None:
    """The model's own loss on the two labelled tokens ``two`` of the first sample must be the
    mean of their losses (read at ``t - 1`` where ``shifted``), as ours is: one token could not
    tell a mean from a sum over tokens."""
    probed = _probe(engine, example, row, two)
    if probed is None:
        return
    own = probed[0]
    each = [float(scores[t - shifted, row[t]]) for t in two]
    mean = sum(each) / 2
    if abs(own - mean) <= _tolerance(own, engine.replicas[0]):
        return
    summed = abs(own - sum(each)) <= _tolerance(own, engine.replicas[0])
    raise _another(type(engine.replicas[0]).__name__, "two labelled tokens of ", own, f"{mean:.6g}, their mean",
                   *(["their sum (reduction='sum'), at another scale"] if summed else []))


def _probe(engine: Any, example: Any, row: torch.Tensor, ts: list) -> Optional[Tuple[float, torch.Tensor]]:
    """The model's own loss with the labelled tokens ``row[ts]`` of the first sample alone, and every
    position's cross-entropy for every class there (``-log_softmax`` of its logits), or None
    where the model gives no loss or no logits of the labels' shape."""
    labels = example["labels"]
    probe = torch.full_like(labels, IGNORE_INDEX)
    probe.reshape(-1, labels.shape[-1])[0, ts] = row[ts]
    output = _called(engine, {**example, "labels": probe})
    own, logits = _own_loss(output), loss_input(output, whole=True)
    if own is None or not isinstance(logits, torch.Tensor) or tuple(logits.shape[:-1]) != tuple(labels.shape):
        return None
    return float(own), -torch.log_softmax(logits.reshape(-1, labels.shape[-1], logits.shape[-1])[0].double(), -1)


def _tolerance(own: float, model: Any) -> float:
    """How far the model's own loss may be from ours and be the same loss: float32's rounding,
    or a 16-bit model's, whose loss may be computed in its own precision."""
    low = any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters())
    return (2e-2 if low else 1e-4) * max(1.0, abs(own))


def _called(engine: Any, batch: Any) -> Any:
    """The first replica's output for ``batch`` with its labels: in eval mode, without
    gradients, its random streams left as they were; None where the call fails (a model not
    called so: the first step runs it as it is, and says what fails there, as before)."""
    net, device = engine.replicas[0], engine.devices[0]
    try:
        with evaluating(net), torch.no_grad(), \
                torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return net(**to_device(batch, device))
    except Exception:
        return None


def _per_sample(engine: Any, example: Any, labels: torch.Tensor) -> Optional[str]:
    """A label per sample (or float labels): the model's own loss on the first sample against
    cross-entropy's (see the module); labels cross-entropy cannot take: the model's own loss."""
    from .losses import LossAdapter         # (losses reads next_token from here)
    output = _called(engine, example)
    own, name = _own_loss(output), type(engine.replicas[0]).__name__
    if own is None:
        return None
    try:
        ours = float(LossAdapter().whole(output, labels.to(engine.devices[0]))[0])
    except (TypeError, ValueError) as e:
        engine.train_on_model_loss()
        what = "float labels" if labels.is_floating_point() else f"labels of shape {tuple(labels.shape)}"
        return (f"dptrain: {name} computes its own loss from the labels, and cross-entropy, dptrain's default, cannot "
                f"take its {what} ({str(e).split(':')[0]}): it trains on its own loss, as step=lambda model, batch: "
                f"model(**batch) (a mean over each device's samples)")
    if abs(float(own) - ours) <= _tolerance(float(own), engine.replicas[0]):
        return None
    raise _another(name, "", float(own), f"{ours:.6g}")


def _no_target(engine: Any, example: Any) -> Optional[str]:
    """A dict batch holding none of the target keys (a question-answering model's
    ``start_positions`` and ``end_positions``): a model computing its own loss from the batch
    trains on it (it was an error asking for a target key or ``step=``)."""
    output = _called(engine, example)
    if _own_loss(output) is None:
        return None
    engine.train_on_model_loss()
    return (f"dptrain: the batches hold no target ({', '.join(map(str, example))}) and "
            f"{type(engine.replicas[0]).__name__} computes its own loss from them: it trains on it, as "
            f"step=lambda model, batch: model(**batch) (a mean over each device's samples)")


def _another(name: str, where: str, own: float, ours: str,
             kind: str = "another one (label smoothing, an auxiliary term)") -> ValueError:
    return ValueError(f"{name}'s own loss on {where}the first sample is {own:.6g}, but cross-entropy of its logits "
                      f"against the labels (what dptrain computes in its place, to sum the loss exactly over devices) "
                      f"is {ours}: its loss is {kind}. Pass step=lambda "
                      f"model, batch: model(**batch) to train on the model's own loss (a mean over each device's "
                      f"samples), or loss=fn(output, labels) for one of your choosing")
