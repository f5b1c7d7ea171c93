"""The reference's modified ResNet-18 for 28x28 images: 3x3 stem, stride 1, no max pooling."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Residual(nn.Module):
    """Two 3x3 conv+BN layers with an identity (or 1x1 conv) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, use_1x1conv: bool = False, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, out_channels, 1, stride=stride) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm2d(out_channels), nn.BatchNorm2d(out_channels)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        return F.relu(Y + (self.conv3(X) if self.conv3 is not None else X))


def _stage(in_channels: int, out_channels: int, first: bool) -> nn.Sequential:
    if first:
        return nn.Sequential(Residual(in_channels, out_channels), Residual(out_channels, out_channels))
    return nn.Sequential(Residual(in_channels, out_channels, use_1x1conv=True, stride=2),
                         Residual(out_channels, out_channels))


def resnet18(num_classes: int = 10, in_channels: int = 1) -> nn.Sequential:
    """Return the modified ResNet-18: 3x3/64 stem with stride 1, BN, ReLU, 4 stages, global pool."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        _stage(64, 64, first=True), _stage(64, 128, first=False),
        _stage(128, 256, first=False), _stage(256, 512, first=False),
        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(512, num_classes))


def init_normal(module: nn.Module, std: float = 0.01) -> None:
    """The reference's init: conv and dense weights N(0, std) (``init.Normal(sigma=0.01)``)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=std)
