"""kvstore ``device``: each parameter is summed *and updated* on one of the devices, its
owner, which then sends the new value to the others (MXNet's update-on-kvstore).

Owners are chosen largest parameter first, each to the device with the least bytes so far,
so the extra memory is balanced: the busiest device carries at most one parameter more than
an equal share. (Round-robin per layer, as MXNet does, can leave one GPU holding a huge
embedding's buffer on top of its share.) Each optimizer update and its state (momentum,
Adam moments) exist once, on the owner, not once per device; owners work concurrently.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from ...core.devices import format_device
from .. import bare_step
from .base import GradientSync, Params, Phase, SyncStep, reciprocal
from .grad_ops import clamp_, grad_norm, scale_, scale_and_clip_


def balanced_placement(sizes: Sequence[int], n_devices: int) -> List[int]:
    """Assign each item to a device, largest first to the least-loaded; return owner per item.

    Greedy longest-processing-time: the device that ends heaviest got its last item when it
    was the lightest, i.e. at most ``sum(sizes) / n`` loaded, so its final load is at most
    ``sum(sizes) / n + max(sizes)``.

    >>> balanced_placement([100, 1, 1, 1], 2)
    [0, 1, 1, 1]
    """
    load = [0] * n_devices
    owner = [0] * len(sizes)
    for j in sorted(range(len(sizes)), key=lambda j: -sizes[j]):
        k = min(range(n_devices), key=lambda d: (load[d], d))
        owner[j] = k
        load[k] += sizes[j]
    return owner


class OwnerDeviceSync(GradientSync):
    name = "device"

    def setup(self, params: Params, state: Sequence[torch.Tensor] = ()) -> None:
        self.sizes = [p.numel() * p.element_size() for p in params[0]]
        self.owner = balanced_placement(self.sizes, len(self.devices))

    def optimized(self, i: int) -> List[int]:
        return [j for j, k in enumerate(self.owner) if k == i]

    @property
    def placement(self) -> List[str]:
        """The device that sums and updates each parameter, in parameter order."""
        return [format_device(self.devices[k]) for k in self.owner]

    @property
    def bytes_per_device(self) -> Dict[str, int]:
        """Extra bytes each device holds to sum the parameters it owns."""
        out = {format_device(d): 0 for d in self.devices}
        for j, k in enumerate(self.owner):
            out[format_device(self.devices[k])] += self.sizes[j]
        return out

    def phases(self, params: Params, step: SyncStep, optimizers: Sequence[torch.optim.Optimizer]) -> List[Phase]:
        n = len(self.devices)
        clipping = step.max_norm is not None
        totals_of: List[List[torch.Tensor]] = [[] for _ in range(n)]
        parts: List[torch.Tensor] = [torch.zeros(())] * n         # each owner's part of the norm
        scales: List[object] = [None] * n

        def sum_and_update(k: int, active: Sequence[int]) -> None:
            dev, is_active = self.devices[k], set(active)
            totals, indices = [], []
            for j in self.optimized(k):
                total = params[k][j].grad
                if j not in is_active:        # stale and ignored: the optimizer skips it
                    params[k][j].grad = None
                    continue
                if total is None:             # used on other devices only: this one adds zeros
                    total = params[k][j].grad = torch.zeros_like(params[k][j])
                for i in range(n):
                    grad = params[i][j].grad
                    if i != k and grad is not None:
                        total.add_(grad.to(dev, non_blocking=True))
                totals.append(total)
                indices.append(j)
            scale = reciprocal(step.denominator, dev)
            step.keep(indices, totals, scale)
            if clipping:            # each owner holds part of the sum: the norm needs them all
                totals_of[k], parts[k], scales[k] = totals, grad_norm(totals, dev, step, indices, scale), scale
                return
            scale_(totals, scale)
            clamp_(totals, step.max_value)
            bare_step.step(optimizers[k])

        def clip_and_update(k: int, active: Sequence[int]) -> None:
            # The norm of the parts, from the same numbers in the same order on every owner.
            norm = torch.linalg.vector_norm(torch.stack([p.to(self.devices[k]) for p in parts]), 2)
            norm = scale_and_clip_(totals_of[k], scales[k], step.max_norm, norm)
            if k == 0:
                step.grad_norm = norm
            clamp_(totals_of[k], step.max_value)
            bare_step.step(optimizers[k])

        def fetch(i: int, active: Sequence[int]) -> None:
            with torch.no_grad():
                for j in active:
                    k = self.owner[j]
                    if k != i:
                        params[i][j].copy_(params[k][j], non_blocking=True)
            for p in params[i]:
                p.grad = None
        # Owners sum and update their parameters, all at once; then every device copies the
        # values it does not own. Clipping needs every owner's part of the norm first.
        return [sum_and_update, clip_and_update, fetch] if clipping else [sum_and_update, fetch]
