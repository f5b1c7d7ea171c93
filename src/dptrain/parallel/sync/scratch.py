"""kvstore ``naive`` / ``ring``: the reference's hand-written allreduce (``dptrain.scratch``)
sums each gradient across the devices, then every device updates its replica."""
from __future__ import annotations

from typing import Sequence

import torch

from ...core.runner import DeviceRunner
from ...scratch.allreduce import allreduce
from .base import GradientSync, Grads, Params


class ScratchAllreduceSync(GradientSync):
    def __init__(self, runner: DeviceRunner, algorithm: str):
        super().__init__(runner)
        self.name = algorithm

    def setup(self, params: Params, state: Sequence[torch.Tensor] = ()) -> None:
        if self.sparse and self.name == "ring":
            raise ValueError("kvstore='ring' cuts each gradient into chunks, and a sparse one (an Embedding or "
                             "EmbeddingBag made with sparse=True) has none to cut: use kvstore='device' (the "
                             "default), 'local' or 'naive'")

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        for j in active:
            allreduce([g[j] for g in grads], self.name)
