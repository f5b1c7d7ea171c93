"""What the user's code does to the model between two steps, made true on every device.

``fit``'s callbacks see the user's own module (``run.model``, the first replica). A callback
that edits its weights in place (a max-norm constraint after each batch, weights clipped,
``run.model.load_state_dict(...)``) changed only that copy: on several devices of one
process the others trained on without it, and the devices drifted apart, silently. An
in-place change of a tensor bumps its version counter (``tensor._version``), so after each
hook that runs user code the loop asks ``ModelEdits.after``: a parameter of the first
replica whose version moved since the last step (or hook) is copied to the other replicas
before the next step. A parameter whose ``requires_grad`` changed is an error (``trainable.py``).

Not seen: a write through ``param.data`` (it does not bump the version: use ``torch.no_grad()``
and the parameter itself, or ``run.load_weights``), and buffers (BatchNorm's running
statistics are each device's own; ``run.load_weights`` sets them on every device).
"""
from __future__ import annotations

from typing import List

import torch

from .replicas import Replicas
from .trainable import TrainableSet


class ModelEdits:
    """The first replica's parameter versions after the last step, and what trains.

    >>> edits = ModelEdits(replicas)
    >>> trainer.step(...); edits.stepped()             # the step's own writes are not edits
    >>> callbacks.on_batch_end(...); edits.after("in on_batch_end")
    """

    def __init__(self, replicas: Replicas):
        self.trainable = TrainableSet(replicas[0])
        self._params: List[List[torch.Tensor]] = [list(m.parameters()) for m in replicas]
        self._first = self._params[0]
        self._versions: List[int] = []
        self.stepped()

    def stepped(self) -> None:
        """After a step (or anything of dptrain's that writes every replica alike)."""
        self._versions = [p._version for p in self._first]

    @property
    def several(self) -> bool:
        """Whether there are other replicas to copy edits to (else ``stepped`` after each step
        is not needed: nothing is copied)."""
        return len(self._params) > 1

    def after(self, where: str, always: bool = False) -> bool:
        """After user code ran (``where``: "in on_batch_end"): a requires_grad changed is a
        ValueError; weights edited in place on the first replica are copied to the others.
        Returns whether any was edited (on one replica: only with ``always``, else False)."""
        self.trainable.check(where)
        if not (always or self.several):
            return False
        versions = [p._version for p in self._first]
        if versions == self._versions:
            return False
        with torch.no_grad():
            for j, (now, then) in enumerate(zip(versions, self._versions)):
                if now != then:
                    for other in self._params[1:]:
                        other[j].copy_(self._first[j])
        self._versions = [p._version for p in self._first]
        return True
