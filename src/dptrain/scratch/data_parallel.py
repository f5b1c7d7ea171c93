"""Data parallelism from scratch: a parameter list copied to every device, gradients allreduced.

One step, as in the reference chapter: split the batch over the devices, run forward and
backward on every device at once, sum each gradient over the devices with ``allreduce``,
then let every device apply the same SGD update (normalised by the *full* batch size), so
the replicas stay identical.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import torch.distributed as dist

from ..core.devices import DeviceLike, check_devices
from ..core.runner import get_runner
from .allreduce import ALGORITHMS, allreduce
from .split import split_batch

Model = Callable[[torch.Tensor, List[torch.Tensor]], torch.Tensor]


class OneProcess:
    """The collective of a process alone: nothing to sum or share (the default)."""
    world_size = 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        pass


def get_params(params: Sequence[torch.Tensor], device: DeviceLike) -> List[torch.Tensor]:
    """Copy ``params`` to ``device`` as fresh leaf tensors that record gradients.

    The copies are distinct from the originals even on the CPU, so each virtual device owns
    its replica.
    """
    device = check_devices([device])[0]
    return [p.detach().to(device, copy=True).requires_grad_(True) for p in params]


@torch.no_grad()
def sgd(params: Sequence[torch.Tensor], lr: float, batch_size: int) -> None:
    """Minibatch SGD on summed gradients: ``p -= lr * p.grad / batch_size``."""
    torch._foreach_add_(list(params), [p.grad for p in params], alpha=-lr / batch_size)


class ScratchDataParallel:
    """Train a functional model ``model(X, params)`` on several devices, from scratch.

    >>> dp = ScratchDataParallel(lenet, lenet_params(), [cpu(0), cpu(1)], allreduce="ring")
    >>> loss_sum = dp.train_batch(X, y, lr=0.2)     # half of X on cpu:0, half on cpu:1
    >>> dp.replicas[0][0] is not dp.replicas[1][0]  # one replica per device, equal values
    True
    """

    def __init__(self, model: Model, params: Sequence[torch.Tensor], devices: Sequence[DeviceLike],
                 allreduce: str = "naive", collective: Optional[Any] = None):
        if allreduce not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {allreduce!r}; choose one of {', '.join(ALGORITHMS)}")
        self.model, self.algorithm = model, allreduce
        self.devices = check_devices(devices)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else \
            int(os.environ.get("WORLD_SIZE", "1")) if os.environ.get("WORLD_SIZE", "1").isdigit() else 1
        if collective is None and world > 1:
            raise ValueError(f"this process is one of {world} (WORLD_SIZE): pass collective="
                             f"dptrain.distributed.get_collective() so that the processes sum their gradients")
        self.collective = collective or OneProcess()
        if self.collective.world_size > 1:      # every process starts from rank 0's values
            params = [p.detach().clone() for p in params]
            self.collective.broadcast_tensors(params)
        self.replicas = [get_params(params, d) for d in self.devices]
        self.runner = get_runner(self.devices)

    def _forward_backward(self, i: int, X: Optional[torch.Tensor], y: Optional[torch.Tensor]) -> torch.Tensor:
        params = self.replicas[i]
        if X is None:                      # no sample for this device in this step
            for p in params:
                p.grad = torch.zeros_like(p)
            return torch.zeros((), device=params[0].device)
        with torch.enable_grad():
            loss = F.cross_entropy(self.model(X, params), y, reduction="sum")
        for p, g in zip(params, torch.autograd.grad(loss, params)):
            p.grad = g
        return loss.detach()

    def _allreduce_grads(self, local_samples: int, non_finite: bool) -> Tuple[int, bool]:
        """Sum gradients over the devices (from scratch), then over processes; return the
        global number of samples and whether any process saw a non-finite loss."""
        if len(self.replicas) > 1:
            for j in range(len(self.replicas[0])):
                allreduce([rep[j].grad for rep in self.replicas], self.algorithm)
        if self.collective.world_size == 1:
            return local_samples, non_finite
        # One message for all gradients, the sample count and the non-finite flag: uneven
        # shards are weighted by their size when the sum is divided by the global count.
        grads = [p.grad for p in self.replicas[0]]
        flat = torch.cat([g.reshape(-1) for g in grads] + [grads[0].new_tensor([float(local_samples),
                                                                                float(non_finite)])])
        self.collective.all_reduce(flat)
        for rep in self.replicas:
            offset = 0
            for p in rep:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        return int(flat[-2].item()), bool(flat[-1].item())

    def train_batch(self, X: torch.Tensor, y: torch.Tensor, lr: float,
                    skip_nonfinite: bool = False, global_size: Optional[int] = None) -> torch.Tensor:
        """Run one SGD step on the batch ``(X, y)``; return the summed loss (on the first device).

        With several processes ``(X, y)`` is this process's part of the global batch (it may
        be smaller than the device count, even empty) and the step divides by the global size.
        ``skip_nonfinite``: if the loss is NaN or infinite in any process, the parameters
        are left as they were (in every process) and the result is NaN. ``global_size`` is
        accepted for the Engine protocol and not needed: the count rides with the gradients.
        """
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
        k = min(len(X), len(self.devices))
        Xs, ys = split_batch(X, y, self.devices[:k], even_split=False) if k else ([], [])
        idle = [None] * (len(self.devices) - k)
        losses = self.runner.map(self._forward_backward, Xs + idle, ys + idle)
        loss = sum(loss.to(self.devices[0]) for loss in losses)
        non_finite = skip_nonfinite and not bool(torch.isfinite(loss))
        if non_finite and self.collective.world_size == 1:
            return loss
        total, skip = self.runner.run(0, self._allreduce_grads, len(X), non_finite)
        if skip:
            return torch.full_like(loss, math.nan)
        if total > 0:
            self.runner.map(lambda i: sgd(self.replicas[i], lr, total))
        return loss

    def state_dict(self) -> dict:
        """The parameters (every replica holds the same); plain SGD keeps no other state."""
        return {"params": [p.detach().clone() for p in self.replicas[0]]}

    def load_state_dict(self, state: dict) -> None:
        params = state.get("params")
        ours = self.replicas[0]
        if not isinstance(params, list) or [tuple(p.shape) for p in params] != [tuple(p.shape) for p in ours]:
            raise ValueError("the checkpoint's parameters do not fit this model (other shapes or count)")
        with torch.no_grad():
            for rep in self.replicas:
                for p, q in zip(rep, params):
                    p.copy_(q)

    def predictors(self) -> List[Callable[[torch.Tensor], torch.Tensor]]:
        """One prediction function per device, each using that device's replica."""
        return [lambda X, p=rep: self.model(X, p) for rep in self.replicas]
