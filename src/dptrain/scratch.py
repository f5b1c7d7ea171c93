"""Data parallelism from scratch: a parameter list copied to every device, gradients allreduced.

One step, as in the reference chapter: split the batch over the devices, run forward and
backward on every device at once, sum each gradient over the devices with ``allreduce``,
then let every device apply the same SGD update (normalised by the *full* batch size), so
the replicas stay identical.
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import torch
import torch.nn.functional as F

from .allreduce import ALGORITHMS, allreduce
from .devices import DeviceLike, check_devices
from .parallel import get_runner
from .split import split_batch

Model = Callable[[torch.Tensor, List[torch.Tensor]], torch.Tensor]


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
                 allreduce: str = "naive"):
        if allreduce not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {allreduce!r}; choose one of {', '.join(ALGORITHMS)}")
        self.model, self.algorithm = model, allreduce
        self.devices = check_devices(devices)
        self.replicas = [get_params(params, d) for d in self.devices]
        self.runner = get_runner(self.devices)

    def _forward_backward(self, i: int, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = self.replicas[i]
        with torch.enable_grad():
            loss = F.cross_entropy(self.model(X, params), y, reduction="sum")
        for p, g in zip(params, torch.autograd.grad(loss, params)):
            p.grad = g
        return loss.detach()

    def _allreduce_grads(self) -> None:
        for j in range(len(self.replicas[0])):
            allreduce([rep[j].grad for rep in self.replicas], self.algorithm)

    def train_batch(self, X: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
        """Run one SGD step on the batch ``(X, y)``; return the summed loss (on the first device)."""
        Xs, ys = split_batch(X, y, self.devices, even_split=False)
        losses = self.runner.map(self._forward_backward, Xs, ys)
        self.runner.run(0, self._allreduce_grads)
        batch_size = len(X)
        self.runner.map(lambda i: sgd(self.replicas[i], lr, batch_size))
        first = self.devices[0]
        return sum(loss.to(first) for loss in losses)

    def predictors(self) -> List[Callable[[torch.Tensor], torch.Tensor]]:
        """One prediction function per device, each using that device's replica."""
        return [lambda X, p=rep: self.model(X, p) for rep in self.replicas]
