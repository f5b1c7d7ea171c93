"""LeNets: the reference's from-scratch LeNet (functions over a parameter list) and modules.

The from-scratch LeNet (``lenet``/``lenet_params``): conv 20@3x3, ReLU, 2x2 average pool,
conv 50@5x5, ReLU, 2x2 average pool, dense 800->128, ReLU, dense 128->10; weights N(0, 0.01),
biases zero; dense weights are stored (in, out) as in the reference, so ``h @ W``.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

_SCRATCH_SHAPES = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]


def lenet_params(scale: float = 0.01, generator: Optional[torch.Generator] = None) -> List[torch.Tensor]:
    """Return the 8 parameters of the from-scratch LeNet: weights N(0, scale), biases zero."""
    return [torch.randn(s, generator=generator) * scale if len(s) > 1 else torch.zeros(s)
            for s in _SCRATCH_SHAPES]


def _used(size: int) -> int:
    """Input pixels per axis that reach the output: 26 of 28 (see ``lenet``)."""
    pooled2 = ((size - 2) // 2 - 4) // 2
    return 2 * (2 * pooled2 + 4) + 2


def lenet(X: torch.Tensor, params: List[torch.Tensor]) -> torch.Tensor:
    """The from-scratch LeNet as a function of a batch ``X`` (N, 1, 28, 28) and its parameters.

    Two exact shortcuts, same function and same gradients as the plain layers:
    - Floor pooling drops the last row and column of conv2's 9x9 output, so only the first
      12x12 of its 13x13 input matter, so only conv1's first 24x24 outputs, so only the
      first 26x26 input pixels. Computing on 26x26 does 21% less conv2 work.
    - channels_last: oneDNN's NHWC kernels run pooling 4x faster than NCHW on this CPU
      (measured 1.4 ms against 6.4 ms for 256x20x24x24), about 10% per step overall.
    """
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h = X[:, :, :_used(X.shape[2]), :_used(X.shape[3])].contiguous(memory_format=torch.channels_last)
    h = F.avg_pool2d(F.relu(F.conv2d(h, W1, b1)), 2)          # 24x24 -> 12x12
    h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), 2)          # 8x8 -> 4x4
    h = F.relu(h.flatten(1) @ W3 + b3)                        # flatten in (C, H, W) order
    return h @ W4 + b4


def lenet_reference(X: torch.Tensor, params: List[torch.Tensor]) -> torch.Tensor:
    """The same LeNet layer by layer, without shortcuts: the spec ``lenet`` is tested against."""
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), 2)          # 26x26 -> 13x13
    h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), 2)          # 9x9 -> 4x4 (floor)
    h = F.relu(h.reshape(h.shape[0], -1) @ W3 + b3)
    return h @ W4 + b4


class FunctionalLeNet(nn.Module):
    """The from-scratch LeNet's function (``lenet``) over its 8 parameters, as an ``nn.Module``.

    >>> net = FunctionalLeNet(lenet_params(generator=torch.Generator().manual_seed(0)))
    >>> net(X)                       # == lenet(X, params)
    """

    def __init__(self, params: Optional[List[torch.Tensor]] = None):
        super().__init__()
        params = lenet_params() if params is None else params
        self.params = nn.ParameterList([nn.Parameter(p.detach().clone()) for p in params])

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return lenet(X, list(self.params))


class ScratchLeNet(nn.Module):
    """The from-scratch LeNet as an ``nn.Module`` (average pooling, 20/50 channels, 128 hidden)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 20, 3), nn.Conv2d(20, 50, 5)
        self.fc1, self.fc2 = nn.Linear(800, 128), nn.Linear(128, num_classes)
        for m in (self.conv1, self.conv2, self.fc1, self.fc2):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        h = F.avg_pool2d(F.relu(self.conv1(X)), 2)
        h = F.avg_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class GluonLeNet(nn.Sequential):
    """The Gluon multi-GPU tutorial's LeNet: conv 6@5x5 and 16@3x3 with max pooling, 120/84 dense.

    Each conv is followed by max pooling, then ReLU: ``relu(maxpool(x)) == maxpool(relu(x))``
    because ReLU is monotonic, and the gradients are identical too (tested), but ReLU then
    runs on a 4x smaller tensor: about 15% faster per step on a CPU.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__(
            nn.Conv2d(1, 6, 5), nn.MaxPool2d(2, 2), nn.ReLU(),
            nn.Conv2d(6, 16, 3), nn.MaxPool2d(2, 2), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes))
