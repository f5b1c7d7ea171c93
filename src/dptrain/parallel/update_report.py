"""What the last update leaves to read: each parameter's gradient norm, and a copy of its gradients.

Kept only when asked (``norms_by_parameter``: ``fit``'s ``log_grad_norm="parameters"``;
``keep_grads``: an ``on_gradients`` callback), since most updates are not logged and a copy
of the gradients costs their memory. What is kept is the summed gradient over every device
and process, divided as the loss's mean is, before clipping: what ``p.grad`` holds before
``clip_grad_norm_`` in a plain loop on the whole batch.

>>> report = UpdateReport(); report.keep_grads = True
>>> step = report.request(batch_size)        # a SyncStep asking the strategy to keep them
>>> ...                                      # the strategy's phases fill it in
>>> report.read(step); report.take_grads(names, device)      # {name: gradient}, then forgotten
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from .sync import SyncStep
from .sync.base import parameter_norms


class UpdateReport:
    """The last update's per-parameter norms and kept gradients, by parameter index."""

    def __init__(self) -> None:
        #: With ``max_norm`` (``math.inf`` clips nothing), keep each parameter's norm too.
        self.norms_by_parameter = False
        #: Keep a copy of each update's summed, divided gradients, before clipping.
        self.keep_grads = False
        self._norms: List[Tuple[Sequence[int], torch.Tensor, object]] = []
        self._grads: List[Tuple[List[int], List[torch.Tensor]]] = []

    def request(self, batch_size=None, extras=None, **options) -> SyncStep:
        """A ``SyncStep`` for one update, asking for what this report keeps."""
        return SyncStep(batch_size, extras, by_parameter=self.norms_by_parameter, keep_grads=self.keep_grads,
                        **options)

    def clear(self) -> None:
        """Forget the last update's (a new one starts, or it was skipped)."""
        self._norms, self._grads = [], []

    def read(self, step: SyncStep) -> None:
        """Keep what a finished ``step`` kept (nothing if it skipped the update)."""
        self._norms = [] if step.skipped else step.parameter_norms
        self._grads = [] if step.skipped else step.kept_grads

    @property
    def holds_grads(self) -> int:
        """How many parts of gradients are kept now (one for each device that updates a part)."""
        return len(self._grads)

    def grad_norms(self, names: Sequence[str]) -> Dict[str, float]:
        """Each parameter's norm by ``names[index]``, in index order (waits for the devices)."""
        norms = parameter_norms(self._norms)
        return {names[j]: norms[j] for j in sorted(norms)}

    def take_grads(self, names: Sequence[str], device: torch.device) -> Dict[str, torch.Tensor]:
        """The kept gradients by ``names[index]``, each on ``device``; then forgotten (freed)."""
        kept, self._grads = self._grads, []
        by_index = {j: g.to(device) for indices, grads in kept for j, g in zip(indices, grads)}   # (no copy if there)
        return {names[j]: by_index[j] for j in sorted(by_index)}
