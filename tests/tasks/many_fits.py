"""Ten different fit calls in one script (models, losses, data sizes, optimizers): run under
``dptrain launch --processes 2`` (1 device each) or alone (``DEVICES`` devices); rank 0 prints
each fit's final train loss and test loss."""
import functools
import os

import torch
from torch import nn

import dptrain

LOSSES = [nn.MSELoss(), nn.L1Loss(), nn.HuberLoss(), nn.SmoothL1Loss(beta=0.5)]
devices = int(os.environ.get("DEVICES", "1"))
for i in range(10):
    torch.manual_seed(i)
    n, width = 40 + 13 * i, 4 + i
    X = torch.randn(n, 3)
    y = X.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1)
    model = nn.Sequential(nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 1))
    optimizer = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5) if i % 3 else \
        functools.partial(torch.optim.Adam, lr=0.01)
    result = dptrain.fit(model, (X, y), (X[:20], y[:20]), loss=LOSSES[i % 4], optimizer=optimizer, epochs=2,
                         batch_size=8 + 2 * (i % 3), devices=devices, log=None, progress=False, seed=i)
    if dptrain.rank() == 0:
        print(f"fit {i}: {result['train_loss']:.5f} {result['test_loss']:.5f}", flush=True)
