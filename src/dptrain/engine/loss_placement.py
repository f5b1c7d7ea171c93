"""A loss module's tensors on every device: class weights, ``pos_weight``, a frozen network.

The model is placed by dptrain, the loss by nobody: ``nn.CrossEntropyLoss(weight=w)`` built
on the CPU, as a script that runs anywhere builds it, met a model's outputs on a GPU (and on
several, each device's), and torch refused the mix of devices. ``LossCopies`` gives each
device the loss on it: the user's own object where its tensors already are (so an edit of
it in a callback counts there), elsewhere a copy made once, as the model's replicas are.

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


def summed_twin(loss: nn.Module) -> nn.Module:
    """``loss`` reduced by summation (its tensors shared): a shard's exact part of the batch's sum."""
    twin = copy.copy(loss)
    twin.reduction = "sum"
    return twin


class LossCopies:
    """``loss`` and its sum-reduced twin ``summed`` on the device of each output they meet."""

    def __init__(self, loss: nn.Module, summed: Optional[nn.Module]):
        self.loss, self.summed = loss, summed
        self._on: Dict[Optional[torch.device], Tuple[Any, Any]] = {}

    @staticmethod
    def needed(loss: Any) -> bool:
        """Whether ``loss`` holds tensors (which live on one device)."""
        return bool(loss_tensors(loss))

    def on(self, output: Any) -> Tuple[Any, Any]:
        """``(loss, summed)`` on the device of ``output``'s first tensor."""
        if isinstance(output, torch.Tensor):
            device: Optional[torch.device] = output.device
        else:
            tensors = tensors_of(output)
            device = tensors[0].device if tensors else None
        placed = self._on.get(device)
        if placed is None:
            if device is None or all(t.device == device for t in loss_tensors(self.loss)):
                placed = (self.loss, self.summed)
            else:
                moved = copy.deepcopy(self.loss).to(device)
                placed = (moved, None if self.summed is None else summed_twin(moved))
            self._on[device] = placed       # (one thread per device: no two build the same)
        return placed
