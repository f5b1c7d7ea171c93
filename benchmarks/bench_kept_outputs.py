"""The cost of putting the devices' kept outputs together (KeptOutputs) on 2 virtual devices:
a LightningModule keeping each validation batch's predictions and labels and each training
batch's per-sample losses, and an unlogged torchmetrics Accuracy updated in training_step and
computed in on_train_epoch_end. Fits of 2 epochs, with the gather and the count as they are vs
made no-ops (figures then wrong: only the time), in turns, medians.

    python benchmarks/bench_kept_outputs.py 11        # rounds (default 5)
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

import dptrain
from dptrain.engine import kept_outputs


class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self._trainer = None
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        self.losses, self.kept = [], {"p": [], "y": []}
        self.acc = MulticlassAccuracy(10, average="micro")

    def forward(self, x):
        return self.net(x)

    def training_step(self, b, i):
        logits = self(b[0])
        losses = F.cross_entropy(logits, b[1], reduction="none")
        self.losses.append(losses.detach())
        self.acc.update(logits.detach(), b[1])
        return losses.mean()

    def validation_step(self, b, i):
        self.kept["p"].append(self(b[0]).argmax(1))
        self.kept["y"].append(b[1])

    def on_validation_epoch_end(self):
        self.kept = {"p": [], "y": []}

    def on_train_epoch_end(self):
        self.acc.compute()
        self.acc.reset()
        self.losses.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


g = torch.Generator().manual_seed(0)
X, y = torch.randn(16384, 32, generator=g), torch.randint(0, 10, (16384,), generator=g)
Xv, yv = X[:4096], y[:4096]
real = (kept_outputs.KeptOutputs.gather, kept_outputs.KeptOutputs.count)
gathers = []


def timed_gather(self, logged):
    t = time.perf_counter()
    real[0](self, logged)
    gathers.append(time.perf_counter() - t)


def fit(off):
    kept_outputs.KeptOutputs.gather = (lambda self, logged: None) if off else timed_gather
    kept_outputs.KeptOutputs.count = (lambda self, model: None) if off else real[1]
    t = time.perf_counter()
    dptrain.fit(Lit(), (X, y), (Xv, yv), epochs=2, batch_size=256, devices=2, log=None, progress=False)
    return time.perf_counter() - t


fit(False); fit(True)
times = {False: [], True: []}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for off in ((False, True) if r % 2 == 0 else (True, False)):
        times[off].append(fit(off))
on, off = statistics.median(times[False]), statistics.median(times[True])
print(f"fit of 2 epochs (64 batches of 256 each, 16 evaluation batches): with the gather {on:.3f} s, without "
      f"{off:.3f} s: {on / off:.3f}x; a gather (one an epoch): median {statistics.median(gathers) * 1e3:.2f} ms "
      f"over {len(gathers)}")
