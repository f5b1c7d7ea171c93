"""A loss module's tensors on every device: class weights, ``pos_weight``, a frozen network.

The model is placed by dptrain, the loss by nobody: ``nn.CrossEntropyLoss(weight=w)`` built
on the CPU, as a script that runs anywhere builds it, met a model's outputs on a GPU (and on
several, each device's), and torch refused the mix of devices. ``LossCopies`` gives each
device the loss on it: the user's own object where its tensors already are (so an edit of
it in a callback counts there), elsewhere a copy, made again after such an edit. The
sum-reduced twin a shard's exact sum needs is a view of the loss (``summed_twin``), never a
copy of it, so edits count in it too.

>>> copies = LossCopies(loss, summed)        # summed: the same loss with reduction="sum", or None
>>> loss_here, summed_here = copies.on(output)
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..data.batch import tensors_of


def loss_tensors(loss: Any) -> List[torch.Tensor]:
    """The parameters and buffers of a loss module (none for a function)."""
    return [*loss.parameters(), *loss.buffers()] if isinstance(loss, nn.Module) else []


_TWINS: Dict[Tuple[type, str], type] = {}


def summed_twin(loss: nn.Module) -> nn.Module:
    """``loss`` reduced by summation: a shard's exact part of the batch's sum. A view of
    ``loss``, not a copy: it shares its attributes (its ``__dict__``), so what a callback
    edits mid-run (``loss.label_smoothing = 0.1``, ``loss.weight``) counts in it too; only
    ``reduction`` is its own (a property of its class, which wins over the shared attribute)."""
    return twin(loss, "sum")


def unreduced_twin(loss: nn.Module) -> nn.Module:
    """``loss`` with ``reduction="none"``: each sample's (element's) value, to weigh
    (``sample_weights.py``); a view of ``loss``, as ``summed_twin``."""
    return twin(loss, "none")


def twin(loss: nn.Module, reduction: str) -> nn.Module:
    """A view of ``loss`` reduced by ``reduction`` (see ``summed_twin``)."""
    kind = type(loss)
    made = _TWINS.get((kind, reduction))
    if made is None:
        made = type(kind.__name__, (kind,), {"reduction": property(lambda self: reduction, lambda self, value: None),
                                             "__reduce_ex__": _reduce, "__module__": kind.__module__,
                                             "__qualname__": kind.__qualname__, "_twin_reduction": reduction})
        _TWINS[(kind, reduction)] = made
    view = object.__new__(made)
    view.__dict__ = loss.__dict__
    return view


def _reduce(view: nn.Module, protocol: int) -> Any:
    """A twin pickles (and deep-copies) as the twin of its loss."""
    loss = object.__new__(type(view).__mro__[1])
    loss.__dict__ = view.__dict__
    return twin, (loss, type(view)._twin_reduction)


class LossCopies:
    """``loss`` and its sum-reduced twin ``summed`` on the device of each output they meet.

    A copy follows the loss: when a callback edits it between steps (a tensor in place, a
    tensor or a plain attribute replaced: ``loss.weight.mul_(2)``, ``loss.label_smoothing =
    0.1``), the copy is made again before its next use (``_mark``: what it was made from)."""

    def __init__(self, loss: nn.Module, summed: Optional[nn.Module]):
        self.loss, self.summed = loss, summed
        self._on: Dict[Optional[torch.device], Tuple[Any, Any]] = {}
        self._made: Dict[Optional[torch.device], Tuple[Any, ...]] = {}

    @staticmethod
    def needed(loss: Any) -> bool:
        """Whether ``loss`` holds tensors (which live on one device)."""
        return bool(loss_tensors(loss))

    def _mark(self) -> Tuple[Any, ...]:
        """What a copy of the loss is made from: its tensors (each one's identity and version)
        and its plain attributes (by identity)."""
        return (tuple((id(t), t._version) for t in loss_tensors(self.loss)),
                tuple((k, id(v)) for k, v in vars(self.loss).items() if not k.startswith("_")))

    def on(self, output: Any) -> Tuple[Any, Any]:
        """``(loss, summed)`` on the device of ``output``'s first tensor."""
        if isinstance(output, torch.Tensor):
            device: Optional[torch.device] = output.device
        else:
            tensors = tensors_of(output)
            device = tensors[0].device if tensors else None
        placed = self._on.get(device)
        if placed is not None and (placed[0] is self.loss or self._made[device] == self._mark()):
            return placed
        if device is None or all(t.device == device for t in loss_tensors(self.loss)):
            placed = (self.loss, self.summed)
        else:       # (one thread per device: no two make the same)
            self._made[device] = self._mark()
            moved = copy.deepcopy(self.loss).to(device)
            placed = (moved, None if self.summed is None else summed_twin(moved))
        self._on[device] = placed
        return placed
