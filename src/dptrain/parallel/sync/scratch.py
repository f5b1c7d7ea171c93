"""kvstore ``naive`` / ``ring``: the reference's hand-written allreduce (``dptrain.scratch``)
sums each gradient across the devices, then every device updates its replica."""
from __future__ import annotations

from typing import Sequence

from ...core.runner import DeviceRunner
from ...scratch.allreduce import allreduce
from .base import GradientSync, Grads


class ScratchAllreduceSync(GradientSync):
    def __init__(self, runner: DeviceRunner, algorithm: str):
        super().__init__(runner)
        self.name = algorithm

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        for j in active:
            allreduce([g[j] for g in grads], self.name)
