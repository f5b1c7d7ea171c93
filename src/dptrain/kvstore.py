"""Where gradients are summed across devices: the KVStore modes of a ``Trainer``.

- ``device``: each parameter is summed *and updated* on one of the devices, its owner, which
  then sends the new value to the others (MXNet's update-on-kvstore). Owners are chosen
  largest parameter first, each to the device with the least bytes so far, so the extra
  memory is balanced: the busiest device carries at most one parameter more than an equal
  share. (Round-robin per layer, as MXNet does, can leave one GPU holding a huge embedding's
  buffer on top of its share.) Each optimizer update and its state (momentum, Adam moments)
  exist once, on the owner, not once per device; owners work concurrently.
- ``local``: every gradient is summed in host memory and copied back; each device updates.
- ``naive``, ``ring``: the allreduce written from scratch (``allreduce.py``) sums each
  gradient across the devices, then each device updates (the reference's from-scratch chapter).
- ``None``: one device, nothing to sum.
- ``dist`` (several processes, ``distributed/dist_kvstore.py``): summed in the process, then
  across processes in buckets.

Every store leaves the replicas' parameters equal, as if one device had stepped on
``scale * sum over devices`` of the gradients.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

from .allreduce import ALGORITHMS, allreduce
from .devices import format_device
from .parallel import DeviceRunner

KVSTORES = ("device", "local", None) + ALGORITHMS

Grads = List[List[Optional[torch.Tensor]]]     # [device][parameter]
Params = List[List[torch.Tensor]]               # [device][parameter]
#: What the summed gradient is divided by: a count, a 0-d tensor (e.g. a loss's weighted
#: count, left on its device so nothing waits for it), or None for no division.
Denominator = Union[int, float, torch.Tensor, None]


def resolve(denominator: Union[Denominator, Callable[[], Denominator]]) -> Denominator:
    """A denominator given as a function (known only once every device computed) is asked now."""
    return denominator() if callable(denominator) else denominator


def reciprocal(denominator: Denominator, device: Optional[torch.device] = None):
    """``1 / denominator`` as a float, or a 0-d float64 tensor on ``device``; None stays None."""
    denominator = resolve(denominator)
    if denominator is None:
        return None
    if isinstance(denominator, torch.Tensor):
        d = denominator.to(device or denominator.device, torch.float64, non_blocking=True)
        return torch.reciprocal(d.reshape(()))
    return 1.0 / denominator


def scale_(grads: List[torch.Tensor], scale) -> None:
    """Multiply gradients by ``scale`` in place (one fused call; nothing when None)."""
    if scale is None or not grads:
        return
    if isinstance(scale, torch.Tensor):
        scale = scale.to(grads[0].device, non_blocking=True)
    torch._foreach_mul_(grads, scale)


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


Phase = Callable[[int, Sequence[int]], None]      # (device index, active parameters)


class KVStore:
    """Sum gradients over devices and update the replicas; subclasses choose where.

    A step is a list of *phases*, each a function of the device index: phase p+1 starts on
    any device only once phase p is done on all of them. ``step`` runs each phase as one
    dispatch to the device threads; ``Trainer.step_with`` runs them inside the threads that
    just did forward and backward, with barriers between (one dispatch per step).
    """
    name: Optional[str] = None

    def __init__(self, runner: DeviceRunner):
        self.runner = runner
        self.devices = runner.devices

    def setup(self, params: Sequence[torch.Tensor]) -> None:
        """Called once with device 0's parameters, before the first step."""

    def optimized(self, i: int) -> Optional[List[int]]:
        """Indices of the parameters device ``i``'s optimizer updates (None: all of them)."""
        return None

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        """Leave in every device's gradient of each ``active`` parameter the sum over devices."""
        raise NotImplementedError

    def phases(self, params: Params, denominator: Denominator,
               optimizers: Sequence[torch.optim.Optimizer]) -> List[Phase]:
        """Default: clear stale gradients; sum everything (from device 0's thread); every
        device scales its gradients and updates its replica."""
        def clear_stale(i: int, active: Sequence[int]) -> None:
            is_active = set(active)
            for j, p in enumerate(params[i]):   # a stale parameter is skipped by the optimizer
                if j not in is_active:
                    p.grad = None

        def reduce(i: int, active: Sequence[int]) -> None:
            if i == 0 and len(params) > 1:
                self.reduce([[p.grad for p in g] for g in params], active)

        def update(i: int, active: Sequence[int]) -> None:
            scale_([params[i][j].grad for j in active], reciprocal(denominator, self.devices[i]))
            optimizers[i].step()
            optimizers[i].zero_grad(set_to_none=True)
        return [clear_stale, reduce, update]

    ignore_stale_grad = False
    check_finite = False    # several processes: skip the update if a summed gradient is not finite
    skipped = False         # ... and whether the last step was skipped so

    def prepare(self, denominator: Denominator = None, extras: Optional[torch.Tensor] = None) -> None:
        """Called before the backward passes of a step (``Trainer.step_with``) with this
        process's denominator and numbers to sum over processes (several processes send them
        with the gradients; one process sums nothing, so ``summed_extras`` is ``extras``)."""
        self.summed_extras = extras

    summed_extras: Optional[torch.Tensor] = None

    def step(self, params: Params, active: Sequence[int], denominator: Denominator,
             optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Sum the gradients of ``active`` parameters, divide them, update every replica."""
        for phase in self.phases(params, denominator, optimizers):
            self.runner.map(lambda i: phase(i, active))

    def close(self) -> None:
        """Take back whatever the store attached to the parameters (hooks)."""


class NoKVStore(KVStore):
    name = None


class LocalKVStore(KVStore):
    name = "local"

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        host = torch.device("cpu")
        for j in active:
            total = grads[0][j].to(host, copy=True)
            for g in grads[1:]:
                total.add_(g[j].to(host))
            for g in grads:
                g[j].copy_(total, non_blocking=True)


class AllreduceKVStore(KVStore):
    """Sum with the from-scratch allreduce (``naive`` or ``ring``), then every device updates."""

    def __init__(self, runner: DeviceRunner, algorithm: str):
        super().__init__(runner)
        self.name = algorithm

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        for j in active:
            allreduce([g[j] for g in grads], self.name)


class DeviceKVStore(KVStore):
    name = "device"

    def setup(self, params: Sequence[torch.Tensor]) -> None:
        self.sizes = [p.numel() * p.element_size() for p in params]
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

    def phases(self, params: Params, denominator: Denominator,
               optimizers: Sequence[torch.optim.Optimizer]) -> List[Phase]:
        n = len(self.devices)

        def sum_and_update(k: int, active: Sequence[int]) -> None:
            dev, is_active = self.devices[k], set(active)
            totals = []
            for j in self.optimized(k):
                total = params[k][j].grad
                if j not in is_active:        # stale and ignored: the optimizer skips it
                    params[k][j].grad = None
                    continue
                for i in range(n):
                    if i != k:
                        total.add_(params[i][j].grad.to(dev, non_blocking=True))
                totals.append(total)
            scale_(totals, reciprocal(denominator, dev))
            optimizers[k].step()

        def fetch(i: int, active: Sequence[int]) -> None:
            with torch.no_grad():
                for j in active:
                    k = self.owner[j]
                    if k != i:
                        params[i][j].copy_(params[k][j], non_blocking=True)
            for p in params[i]:
                p.grad = None
        # Owners sum and update their parameters, all at once; then every device copies the
        # values it does not own.
        return [sum_and_update, fetch]


def create_kvstore(kind: Optional[str], runner: DeviceRunner, collective=None,
                   bucket_cap_mb: float = 25.0) -> KVStore:
    """Return the store for ``kind`` ("device", "local", "naive", "ring", "dist" or None).

    With several processes (``collective.world_size > 1``) the store is always "dist".
    """
    if collective is not None and collective.world_size > 1:
        from .distributed.dist_kvstore import DistKVStore
        if kind not in KVSTORES + ("dist",):
            raise ValueError(f"unknown kvstore {kind!r}; choose one of 'device', 'local', 'naive', 'ring', "
                             f"'dist', None")
        return DistKVStore(runner, collective, bucket_cap_mb)
    if kind == "dist":
        return DeviceKVStore(runner) if len(runner.devices) > 1 else NoKVStore(runner)
    if kind == "device":
        return DeviceKVStore(runner) if len(runner.devices) > 1 else NoKVStore(runner)
    if kind == "local":
        return LocalKVStore(runner)
    if kind in ALGORITHMS:
        return AllreduceKVStore(runner, kind) if len(runner.devices) > 1 else NoKVStore(runner)
    if kind is None:
        if len(runner.devices) > 1:
            raise ValueError(f"kvstore=None cannot sum gradients over {len(runner.devices)} devices; "
                             f"use kvstore='device' or 'local'")
        return NoKVStore(runner)
    raise ValueError(f"unknown kvstore {kind!r}; choose one of 'device', 'local', 'naive', 'ring', None")
