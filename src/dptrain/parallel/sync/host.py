"""kvstore ``local``: every gradient summed in host memory, copied back; each device updates."""
from __future__ import annotations

from typing import Sequence

import torch

from .base import GradientSync, Grads


class HostSync(GradientSync):
    name = "local"

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        host = torch.device("cpu")
        for j in active:
            total = grads[0][j].to(host, copy=True)
            for g in grads[1:]:
                total.add_(g[j].to(host))
            for g in grads:
                g[j].copy_(total, non_blocking=True)
