"""BatchNorm with statistics over the whole batch, across the devices of one process.

With ``sync_batchnorm=True`` every replica's BatchNorm layers share one ``ThreadGroup``: in
training, forward sums each channel's count, mean and spread over all shards, and backward
sums the two gradient terms, exactly as ``torch.nn.SyncBatchNorm`` does across processes.
So N devices compute what one device computes on the whole batch. Forward and backward of
all shards must run at the same time (``Replicas.forward_backward`` does), since each layer
waits for every device.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
from torch import nn

from ..distributed.collective import Collective
from ..distributed.env import DEFAULT_TIMEOUT_S


_state = threading.local()
LATE_BATCHNORM = ("sync_batchnorm: not every device reached this BatchNorm layer in time; run forward and backward "
                  "of all shards together with replicas.forward_backward(Xs, ys), not loss.backward() one shard "
                  "after another")


@contextmanager
def synchronized() -> Iterator[None]:
    """Mark this thread as running one shard of a step of all replicas (see ``Replicas``)."""
    before = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = before


def _in_step() -> bool:
    return getattr(_state, "on", False)


class ThreadGroup:
    """Exchange values across the N device threads of one process: a barrier and shared slots.
    ``late``: the error's words when a device does not come in time (what to run instead)."""

    def __init__(self, size: int, timeout: float = DEFAULT_TIMEOUT_S, collective: Optional[Collective] = None,
                 late: str = LATE_BATCHNORM):
        self.size, self.late = size, late
        self.collective = collective or Collective()
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: List[Any] = [None] * size
        self._shared: List[Any] = []
        self.aborted = False

    @property
    def total_size(self) -> int:
        """Devices in the group over all processes."""
        return self.size * self.collective.world_size

    def share(self, rank: int, value: Any, across: Optional[Callable[[List[Any]], List[Any]]] = None) -> List[Any]:
        """Every device's ``value``, in device order. ``across``: what thread 0 makes of this
        process's list, once every device has given its value (the list over every process's
        devices, exchanged on a process group of the caller's), which every thread then gets."""
        self._slots[rank] = value
        self._wait()
        if across is not None:
            if rank == 0:
                try:
                    self._shared = across(list(self._slots))
                except Exception as e:      # (every thread raises it, none waits for thread 0)
                    self._shared = [e]
            self._wait()
            out = self._shared
        else:
            out = list(self._slots)
        self._wait()        # nobody refills a slot before every rank has read them all
        if across is not None and len(out) == 1 and isinstance(out[0], Exception):
            raise out[0]
        return out

    def all_gather(self, rank: int, tensor: torch.Tensor) -> List[torch.Tensor]:
        """Return every device's ``tensor`` (of every process, in order) on this rank's device.

        Thread 0 of each process exchanges its process's tensors with the other processes
        (on a process group of its own, so it never interleaves with the gradients')."""
        def across(local: List[torch.Tensor]) -> List[torch.Tensor]:
            stacked = torch.stack([t.to(tensor.device) for t in local])
            return [row for block in self.collective.all_gather(stacked) for row in block.unbind(0)]
        shared = self.share(rank, tensor, across if self.collective.world_size > 1 else None)
        return [t.to(tensor.device) for t in shared]

    def all_reduce(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        """Return the sum over ranks of ``tensor`` (every rank adds in the same order)."""
        return torch.stack(self.all_gather(rank, tensor)).sum(0)

    def abort(self) -> None:
        """A device failed before its exchange: the others stop waiting for it at once, with
        a ``BrokenBarrierError`` (the device runner raises the failed device's error, not theirs)."""
        self.aborted = True
        self._barrier.abort()

    def _wait(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            if self.aborted:
                raise
            self._barrier.reset()
            raise RuntimeError(self.late) from None


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group, rank):
        dims = [0] + list(range(2, x.dim()))
        count = x.numel() // x.shape[1]
        mean = x.mean(dims)
        m2 = (x - mean.view(1, -1, *[1] * (x.dim() - 2))).pow(2).sum(dims)
        # Chan et al.'s pairwise combination, in float64: exact for any split of the batch.
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device),
                           mean.double() * count, m2.double()])
        c = x.shape[1]
        stacked = torch.stack(group.all_gather(rank, local))          # [ranks, 1 + 2C]
        ns, sums, m2s = stacked[:, :1], stacked[:, 1:1 + c], stacked[:, 1 + c:]
        n = ns.sum()
        g_mean = sums.sum(0) / n
        var = (m2s + ns * (sums / ns - g_mean) ** 2).sum(0) / n
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * n / max(n.item() - 1, 1)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean_f, invstd = g_mean.to(x.dtype), torch.rsqrt(var + eps).to(x.dtype)
        xhat = (x - mean_f.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.group, ctx.rank, ctx.n = group, rank, n.item()
        return xhat * weight.view(shape) + bias.view(shape)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dims = [0] + list(range(2, dy.dim()))
        shape = (1, -1) + (1,) * (dy.dim() - 2)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        both = ctx.group.all_reduce(ctx.rank, torch.cat([sum_dy, sum_dy_xhat]))
        g_sum_dy, g_sum_dy_xhat = both.chunk(2)
        dx = (weight * invstd).view(shape) * (
            dy - (g_sum_dy / ctx.n).view(shape) - xhat * (g_sum_dy_xhat / ctx.n).view(shape))
        # This replica's own share: the Trainer sums weight and bias gradients over devices.
        return dx, sum_dy_xhat, sum_dy, None, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm layer whose training statistics cover the shards of every device."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, group: ThreadGroup, rank: int):
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, device="meta")
        # The layer's own parameters and buffers, not copies: an optimizer built on the model
        # holds them, and the layer put back after training (``restore_batchnorm``) has them trained.
        for name, p in bn.named_parameters(recurse=False):
            setattr(self, name, p)
        for name, b in bn.named_buffers(recurse=False):
            setattr(self, name, b)
        self.train(bn.training)
        self.group, self.rank = group, rank
        self._replaced = [bn]           # (a list: not a submodule, not in the state_dict)

    def replaced(self) -> nn.modules.batchnorm._BatchNorm:
        """The layer this one stands in for, with its settings and mode (they share the
        parameters and buffers, so it holds what was trained)."""
        original = self._replaced[0]
        original.momentum, original.eps = self.momentum, self.eps
        return original.train(self.training)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A copy or a pickle of the model mid-run (copy.deepcopy for torch's AveragedModel, timm's
        # ModelEmaV2, a best model kept by a callback; torch.save(model)) is of the layer it
        # replaced: this one holds its group's barrier and locks, which neither can copy.
        return _itself, (self.replaced(),)

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm needs at least 2-d input (N, C, ...), got {x.dim()}-d")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Outside a step of all replicas (e.g. the user's own model called alone) this is
        # plain BatchNorm, so the model keeps working on its own.
        if (not self.training or self.group.total_size == 1 or not _in_step() or not self.affine
                or self.momentum is None):
            return super().forward(x)
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        return _SyncBatchNormFn.apply(x, self.weight, self.bias, self.running_mean, self.running_var,
                                      self.eps, self.momentum, self.group, self.rank)


def _itself(layer: nn.Module) -> nn.Module:
    return layer


def convert_sync_batchnorm(modules: Sequence[nn.Module], collective: Optional[Collective] = None) -> ThreadGroup:
    """Replace the BatchNorm layers of every replica with ``SyncBatchNorm`` sharing one group
    (each holding the replaced layer's parameters and buffers); with ``collective``,
    statistics also cover the other processes' devices. ``restore_batchnorm`` undoes it."""
    group = ThreadGroup(len(modules), collective=collective)
    for rank, module in enumerate(modules):
        for name, child in list(module.named_modules()):
            for attr, sub in list(child.named_children()):
                if isinstance(sub, nn.modules.batchnorm._BatchNorm) and not isinstance(sub, SyncBatchNorm):
                    setattr(child, attr, SyncBatchNorm(sub, group, rank))
    return group


def restore_batchnorm(module: nn.Module) -> None:
    """Put back the BatchNorm layers ``convert_sync_batchnorm`` replaced in ``module``, trained
    (they share the parameters and buffers), in the mode the module is in: the model as it
    was, which ``torch.save`` can pickle (a ``SyncBatchNorm`` holds its group's locks)."""
    for child in list(module.modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, SyncBatchNorm):
                setattr(child, attr, sub.replaced())
