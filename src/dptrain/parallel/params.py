"""What a ``Trainer`` trains when it is given parameters rather than ``Replicas``: one list
per device (the from-scratch layout), or one module or list on one device."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..core.devices import DeviceLike, check_devices, cpu


def parameter_lists(source) -> Tuple[List[List[torch.Tensor]], List[torch.Tensor]]:
    """The trainable parameters per device, and the frozen ones (of a module)."""
    frozen: List[torch.Tensor] = []
    if isinstance(source, nn.Module):
        frozen = [p for p in source.parameters() if not p.requires_grad]
        groups = [[p for p in source.parameters() if p.requires_grad]]
    else:
        items = list(source)
        if not items:
            raise ValueError("Trainer got no parameters")
        groups = [items] if all(isinstance(p, torch.Tensor) for p in items) else [list(g) for g in items]
        if len({len(g) for g in groups}) != 1:
            raise ValueError("every device needs the same parameters: got lists of lengths "
                             f"{[len(g) for g in groups]}")
        for g in groups:                # the from-scratch layout: plain tensors to train
            for p in g:
                if not p.requires_grad:
                    p.requires_grad_(True)
    if not groups[0]:
        raise ValueError("the model has no trainable parameter (every one has requires_grad=False)")
    return groups, frozen


def devices_of(groups: List[List[torch.Tensor]], devices: Optional[Sequence[DeviceLike]] = None) -> List[torch.device]:
    """The devices the lists live on: ``devices`` if given; CPU lists are virtual devices
    cpu:0, cpu:1, ... in order."""
    def device_of(t: torch.Tensor) -> torch.device:
        return t.device if t.device.type != "cpu" else cpu(0)
    found = check_devices(devices) if devices is not None else \
        [cpu(i) for i in range(len(groups))] if all(device_of(g[0]).type == "cpu" for g in groups) else \
        [device_of(g[0]) for g in groups]
    if len(found) != len(groups):
        raise ValueError(f"got {len(groups)} parameter lists for {len(found)} devices")
    return found
