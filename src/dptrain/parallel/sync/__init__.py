"""Summing gradients: one interface (``base.GradientSync``), one strategy per module.

``create`` picks the strategy for a ``kvstore`` name (the Gluon word users know for it):

=========  ===================================================  ==================
kvstore    where gradients are summed                           module
=========  ===================================================  ==================
device     on each parameter's owner device, which updates it   ``device.py``
local      in host memory; every device updates                 ``host.py``
naive      the hand-written allreduce (``dptrain.scratch``)     ``scratch.py``
ring       the hand-written ring allreduce                      ``scratch.py``
None       one device: nothing to sum                           ``base.py``
(any)      several processes: in buckets during backward        ``processes.py``
=========  ===================================================  ==================
"""
from __future__ import annotations

from typing import Optional

from ...core.runner import DeviceRunner
from ...distributed.collective import Collective
from ...scratch.allreduce import ALGORITHMS
from .base import Denominator, GradientSync, SyncStep
from .buckets import DEFAULT_BUCKET_MB
from .device import OwnerDeviceSync
from .host import HostSync
from .processes import ProcessSync
from .scratch import ScratchAllreduceSync

KVSTORES = ("device", "local", None) + ALGORITHMS

__all__ = ["Denominator", "GradientSync", "KVSTORES", "SyncStep", "create"]


def create(kind: Optional[str], runner: DeviceRunner, collective: Collective,
           bucket_cap_mb: float = DEFAULT_BUCKET_MB) -> GradientSync:
    """The strategy for ``kind`` ("device", "local", "naive", "ring", "dist" or None).

    With several processes (``collective.world_size > 1``) it is always the processes' one.
    """
    known = KVSTORES + ("dist",)
    if kind not in known:
        extra = ", 'dist'" if collective.world_size > 1 else ""
        raise ValueError(f"unknown kvstore {kind!r}; choose one of 'device', 'local', 'naive', 'ring'{extra}, None")
    if collective.world_size > 1:
        return ProcessSync(runner, collective, bucket_cap_mb)
    n = len(runner.devices)
    if kind == "local":
        return HostSync(runner)
    if kind is None and n > 1:
        raise ValueError(f"kvstore=None cannot sum gradients over {n} devices; use kvstore='device' or 'local'")
    if n == 1:
        return GradientSync(runner)
    if kind in ALGORITHMS:
        return ScratchAllreduceSync(runner, kind)
    return OwnerDeviceSync(runner)          # "device", and "dist" in one process
