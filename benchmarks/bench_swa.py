"""What stochastic weight averaging costs: torch's swa_utils recipe in the plain loop against
``fit(callbacks=[SWA(...)])`` on one device, each beside its run without SWA, on the same data.

    python benchmarks/bench_swa.py --rounds 5 --out benchmarks/results/swa.json
    python benchmarks/bench_swa.py --smoke

The program: a CNN with BatchNorm (two 3x3 convolutions of 16 and 32 channels, each with
BatchNorm, ReLU and 2x2 pooling, then a linear layer to 10 classes) on random 28x28 images
(8192, batch 128: 64 steps an epoch), SGD with momentum, a cosine schedule; SWA over the last
half of the epochs (SWALR to 0.01 over 1 epoch), then BatchNorm's statistics recomputed over
the training data (torch's ``update_bn`` in the plain loop; ``SWA``'s own pass in ``fit``). A
figure is one whole training call's wall seconds (set-up, every epoch, the average and the
BatchNorm pass); variants take turns each round, the order rotating; ratios are paired (in the
same round) and medians over the rounds.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dptrain  # noqa: E402
from common import in_turns, paired, rounds_parser, save_result  # noqa: E402
from dptrain.callbacks import SWA  # noqa: E402

BATCH, SWA_LR = 128, 0.01


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def parts(model, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)


def plain(data, epochs, swa):
    """The plain loop as torch's SWA documentation writes it (or without its SWA lines)."""
    start = time.perf_counter()
    model = cnn()
    opt, scheduler = parts(model, epochs)
    loader = DataLoader(TensorDataset(*data), batch_size=BATCH, shuffle=True)
    if swa:
        swa_model, swa_scheduler = AveragedModel(model), SWALR(opt, swa_lr=SWA_LR, anneal_epochs=1)
    for epoch in range(epochs):
        model.train()
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        if swa and epoch >= epochs // 2:
            swa_model.update_parameters(model)
            swa_scheduler.step()
        else:
            scheduler.step()
    if swa:
        update_bn(loader, swa_model)
    return time.perf_counter() - start


def fitted(data, epochs, swa):
    start = time.perf_counter()
    model = cnn()
    callbacks = [SWA(SWA_LR, swa_epoch_start=epochs // 2 + 1, annealing_epochs=1)] if swa else []
    dptrain.fit(model, data, optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
                scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs), epochs=epochs,
                batch_size=BATCH, devices=1, callbacks=callbacks, log=None, progress=False)
    return time.perf_counter() - start


def main() -> None:
    parser = rounds_parser(__doc__, 8192)
    parser.set_defaults(epochs=4)
    args = parser.parse_args()
    rounds, epochs, samples = (1, 2, 1024) if args.smoke else (args.rounds, args.epochs, args.samples)
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(samples, 1, 28, 28, generator=g), torch.randint(0, 10, (samples,), generator=g))
    variants = {"plain": lambda: plain(data, epochs, False), "plain + SWA": lambda: plain(data, epochs, True),
                "fit": lambda: fitted(data, epochs, False), "fit + SWA": lambda: fitted(data, epochs, True)}
    names = list(variants)
    variants[names[0]]()                    # a warm-up call (first-call costs of torch's kernels)
    raw = in_turns(variants, rounds)
    speed = {k: [1 / s for s in v] for k, v in raw.items()}       # (paired takes rates: higher is faster)
    figures = {"seconds": {k: statistics.median(v) for k, v in raw.items()},
               "fit + SWA / plain + SWA (speed)": paired(speed, "fit + SWA", "plain + SWA"),
               "fit / plain (speed)": paired(speed, "fit", "plain"),
               "plain: with SWA / without (time)": paired(raw, "plain + SWA", "plain"),
               "fit: with SWA / without (time)": paired(raw, "fit + SWA", "fit"), "raw": raw}
    command = "python benchmarks/bench_swa.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "epochs": epochs, "samples": samples, **figures}, command, args.out)


if __name__ == "__main__":
    main()
