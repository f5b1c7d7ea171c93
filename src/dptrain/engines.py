"""The Trainer path of a recipe: an ``nn.Module`` replicated on the devices, a ``Trainer``."""
from __future__ import annotations

import math
from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch
from torch import nn

from .replicas import Init, replicate, sum_cross_entropy
from .split import split_batch
from .trainer import Trainer


class ModuleDataParallel:
    """Train ``net`` data-parallel: split, forward+backward on all devices, ``Trainer.step``.

    >>> dp = ModuleDataParallel(GluonLeNet(), [cpu(0), cpu(1)], "sgd", {"learning_rate": 0.04})
    >>> loss_sum = dp.train_batch(X, y, lr=0.04)
    """

    def __init__(self, net: nn.Module, devices: Sequence[torch.device], optimizer: str = "sgd",
                 optimizer_params: Optional[Mapping[str, Any]] = None, kvstore: Optional[str] = "device",
                 init: Optional[Init] = None, sync_batchnorm: bool = False,
                 amp: Optional[torch.dtype] = None, channels_last: bool = False,
                 bucket_cap_mb: float = 25.0):
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        self.replicas = replicate(net, devices, init=init, sync_batchnorm=sync_batchnorm)
        self.devices = self.replicas.devices
        self.trainer = Trainer(self.replicas, optimizer, optimizer_params, kvstore=kvstore,
                               bucket_cap_mb=bucket_cap_mb)
        self.amp = amp
        self.runner = self.trainer.runner

    def train_batch(self, X: torch.Tensor, y: torch.Tensor, lr: float,
                    skip_nonfinite: bool = False, global_size: Optional[int] = None) -> torch.Tensor:
        """One step on ``(X, y)``; return the summed loss on the first device.

        ``global_size``: with several processes, the global batch's size if the caller knows
        it (the training loop does); otherwise the processes sum their sizes in a message.

        ``skip_nonfinite``: if a gradient is NaN or infinite on any device of any process,
        the model is left as it was and the result is NaN.
        """
        if lr != self.trainer.learning_rate:
            self.trainer.set_learning_rate(lr)
        # With several processes this is the process's part of the global batch: it may have
        # fewer samples than devices, or none; devices without samples contribute zeros.
        k = min(len(X), len(self.devices))
        Xs, ys = split_batch(X, y, self.devices[:k], even_split=False) if k else ([], [])
        if k:
            self.replicas.initialize(Xs[0])

        def compute(i: int, scale: float) -> torch.Tensor:
            return self._forward_backward(i, Xs[i], ys[i], scale) if i < k else self._idle(i)
        if skip_nonfinite:
            losses = self.runner.map(lambda i: compute(i, 1.0))
            loss = sum(loss.float().to(self.devices[0]) for loss in losses)
            stepped = self.trainer.step(len(X), skip_nonfinite=True)
            return loss if stepped else torch.full_like(loss, math.nan)
        # Several processes: divide the loss by the global sample count up front (one tiny
        # message), so gradients leave backward already scaled and need no extra pass.
        total = None
        if self.trainer.world_size > 1:
            total = global_size if global_size is not None else self.trainer.global_samples(len(X))
        scale = 1.0 / total if total else 1.0
        losses = self.trainer.step_with(lambda i: compute(i, scale), len(X), prescaled_total=total)
        return sum(loss.float().to(self.devices[0]) for loss in losses) / scale

    def _forward_backward(self, i: int, X: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        # The memory-format copy happens here, on the device's own thread.
        loss = sum_cross_entropy if scale == 1.0 else (lambda out, t: sum_cross_entropy(out, t) * scale)
        return self.replicas.forward_backward_one(i, X.contiguous(memory_format=self.memory_format), y,
                                                  loss, self.amp)

    def _idle(self, i: int) -> torch.Tensor:
        for p in self.replicas[i].parameters():
            p.grad = torch.zeros_like(p)
        return torch.zeros((), device=self.devices[i])

    def predictors(self) -> List[Callable[[torch.Tensor], torch.Tensor]]:
        return list(self.replicas)

    def state_dict(self) -> dict:
        return {"model": self.replicas[0].state_dict(), "trainer": self.trainer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        try:
            for m in self.replicas:
                m.load_state_dict(state["model"])
        except (KeyError, RuntimeError) as e:
            raise ValueError(f"the checkpoint's model does not fit this one: {str(e).splitlines()[0]}") from None
        self.trainer.load_state_dict(state["trainer"])
