"""A metric that is a function of the whole evaluation set's outputs and targets:
scikit-learn's ``roc_auc_score``, a Hugging Face ``Trainer``'s ``compute_metrics``.

A ``(sum, count)`` metric adds up shard by shard; a torchmetrics object keeps a state that
merges. A plain function of every output at once does neither, so ``whole_set(fn)`` keeps
the outputs and targets each device sees (detached, on its device), puts the devices'
together after the evaluation, gathers every process's (``all_gather_object``), and calls
``fn`` once, on the CPU, in every process (so the figures are the same everywhere). Every
sample is in one shard of one process, each output beside its own target: ``fn`` sees the
whole set, in the data's order on one device; over several it sees the devices' and the
processes' parts one after the other (a figure that does not depend on the order, as a
metric does not, is the one device's, up to float rounding)::

    fit(model, train, test, metrics={"auc": whole_set(lambda out, y: roc_auc_score(y, out[:, 1]))})
    fit(model, train, test, metrics=whole_set(compute_metrics))     # a Trainer's: {"f1": ...} -> test_f1

``fn(outputs, targets)`` gets two CPU tensors (batches of sequences, each padded to its own
longest, padded to the longest with -100, as the Trainer does); ``fn(eval_pred)`` (one parameter, the
Trainer's) gets ``(predictions, label_ids)`` as NumPy arrays, with those names. It returns a
number (``test_<name>``) or a dict (``test_<name>_<key>``, or ``test_<key>`` given alone). It
holds every output until the evaluation's end, as the Trainer does: a language model's logits
over its vocabulary are reduced batch by batch with ``preprocess(output, target)``, the Trainer's
``preprocess_logits_for_metrics``::

    whole_set(compute_metrics, preprocess=lambda logits, labels: logits.argmax(-1))
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from ..core.signatures import takes


class EvalPrediction(NamedTuple):
    """What a Hugging Face ``compute_metrics(eval_pred)`` unpacks: the outputs and the labels."""
    predictions: np.ndarray
    label_ids: np.ndarray


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()


class WholeSet:
    """``fn`` over the whole set: a metric object (``update``/``compute``/``reset``/
    ``merge_state``) as ``stateful_metrics.StatefulMetrics`` runs torchmetrics' objects."""

    def __init__(self, fn: Callable, preprocess: Optional[Callable] = None):
        if not callable(fn):
            raise TypeError(f"whole_set takes a function fn(outputs, targets) -> number or dict, "
                            f"got {type(fn).__name__}")
        if preprocess is not None and not callable(preprocess):
            raise TypeError(f"whole_set takes preprocess=fn(output, target) -> what to keep of a batch's output, "
                            f"got {type(preprocess).__name__}")
        self.fn, self.preprocess = fn, preprocess
        self.name = getattr(fn, "__name__", "metric")
        self.name = self.name if self.name.isidentifier() else "metric"     # (a lambda)
        self.hugging_face = takes(fn, 1) and not takes(fn, 2)      # (a Trainer's compute_metrics(eval_pred))
        #: As torchmetrics': whether ``compute`` gathers the other processes' parts.
        self.distributed_available_fn = lambda: dist.is_available() and dist.is_initialized()
        self.outputs: List[torch.Tensor] = []
        self.targets: List[torch.Tensor] = []

    def __repr__(self) -> str:
        return f"whole_set({self.name})"

    def __deepcopy__(self, memo: Dict[int, Any]) -> "WholeSet":     # (one per device: fn shared)
        made = WholeSet.__new__(WholeSet)
        made.__dict__.update(self.__dict__, outputs=list(self.outputs), targets=list(self.targets))
        return made

    def reset(self) -> None:
        self.outputs, self.targets = [], []

    def update(self, output: Any, target: Any) -> None:
        for what, value in (("output", output), ("target", target)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"whole_set({self.name}) takes tensors, got a {type(value).__name__} {what}: let a "
                                f"step (or a LightningModule's validation_step) return {{'loss': ..., 'logits': "
                                f"...}}, or give fit forward=fn(model, batch) -> (output tensor, target tensor)")
        if self.preprocess is not None:
            output = self.preprocess(output.detach(), target.detach())
            if not isinstance(output, torch.Tensor):
                raise TypeError(f"whole_set({self.name})'s preprocess returned a {type(output).__name__}: return a "
                                f"tensor (one row per sample: logits.argmax(-1))")
        self.outputs.append(output.detach())
        self.targets.append(target.detach())

    @property
    def metric_state(self) -> Dict[str, List[torch.Tensor]]:
        return {"outputs": self.outputs, "targets": self.targets}

    def merge_state(self, other: Union["WholeSet", Dict[str, List[torch.Tensor]]]) -> None:
        state = other.metric_state if isinstance(other, WholeSet) else other
        self.outputs += list(state["outputs"])
        self.targets += list(state["targets"])

    def _whole(self) -> List[torch.Tensor]:
        parts = [(_cat([t.cpu() for t in self.outputs]) if self.outputs else None,
                  _cat([t.cpu() for t in self.targets]) if self.targets else None)]
        if self.distributed_available_fn() and dist.get_world_size() > 1:
            gathered: List[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, parts[0])
            parts = gathered
        parts = [p for p in parts if p[0] is not None]
        if not parts:
            raise ValueError(f"whole_set({self.name}) saw no sample: the evaluation set is empty")
        return [_cat([p[i] for p in parts]) for i in (0, 1)]

    def compute(self) -> Any:
        outputs, targets = self._whole()
        value = self.fn(EvalPrediction(_numpy(outputs), _numpy(targets))) if self.hugging_face \
            else self.fn(outputs, targets)
        if isinstance(value, dict):
            return {k: _number(v, f"{self.name}'s {k!r}") for k, v in value.items()}
        return _number(value, self.name)


#: What fills the positions a shorter batch lacks (Hugging Face's ``padding_index``, the label
#: cross-entropy ignores): a token classifier's batches are padded each to its own longest.
PAD = -100


def _cat(parts: List[torch.Tensor]) -> torch.Tensor:
    """``parts`` one after the other along the first axis; parts longer in another axis than
    others (batches of sequences padded each to its own length) are padded to the longest
    with ``PAD``, as the Trainer pads them."""
    if len({t.shape[1:] for t in parts}) > 1:
        if len({t.dim() for t in parts}) > 1:
            raise ValueError(f"whole_set: the outputs or targets of the batches have shapes "
                             f"{sorted({tuple(t.shape) for t in parts})}: give each sample's alike")
        longest = [max(t.shape[d] for t in parts) for d in range(1, parts[0].dim())]
        parts = [torch.nn.functional.pad(t, [x for d in reversed(range(1, t.dim()))
                                             for x in (0, longest[d - 1] - t.shape[d])], value=PAD) for t in parts]
    return torch.cat(parts)


def _number(value: Any, what: str) -> Any:
    """A figure the rows can hold: a number (NumPy's and one-element tensors made floats), a
    string, or a list (a tensor of several numbers, as a confusion matrix)."""
    if isinstance(value, torch.Tensor):         # (tolist: NumPy has no bfloat16)
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, (int, float, str, list)) and not isinstance(value, bool):
        return value
    raise TypeError(f"whole_set: {what} gave a {type(value).__name__}: return a number, or a dict of numbers")


def whole_set(fn: Callable, preprocess: Optional[Callable] = None) -> WholeSet:
    """``fn`` as a metric over the whole evaluation set (see the module): ``metrics={"auc":
    whole_set(fn)}``, or a Hugging Face ``compute_metrics`` alone, ``metrics=whole_set(fn)``;
    ``preprocess(output, target)``: what to keep of each batch's output (its arg-max)."""
    return WholeSet(fn, preprocess)
