"""The public API (``dptrain.fit``) on a user's own model and data, in one script.

    python benchmarks/bench_api.py --data-dir ../shared/datasets --out benchmarks/results/api.json

1. **Your module vs the built-in recipe**: ``fit`` on a LeNet class written here (the Gluon
   tutorial's, as a user would write it) against ``dptrain train --recipe lenet-mnist``
   (the same network and settings, on Fashion-MNIST), both on 2 virtual CPU devices.
2. **A Dataset with workers vs tensors in memory**: the from-scratch LeNet recipe
   (``lenet-scratch``'s Task) fed by a torchvision-style Dataset (uint8 images turned into
   float tensors per sample, ``(image, label)`` pairs) with 0, 1 and 2 worker processes, and
   by the same Dataset with ``__getitems__`` (one read per batch), against the recipe's
   in-memory tensors; and where the Dataset path's time goes.

Variants take turns, ``--repeats`` times after a warm-up; each figure is the median of
images/s over the timed epochs (``--batches`` batches each), ratios are paired.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time

import torch
from torch import nn
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

import dptrain
from dptrain.run.config import TrainConfig
from dptrain.data.dataset_loader import _Part, _Seeded
from dptrain.recipes import RECIPES
from dptrain.run.session import run_task


class MyLeNet(nn.Module):
    """The Gluon tutorial's LeNet written as a user writes it (not dptrain.models.GluonLeNet)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 6, 5), nn.MaxPool2d(2), nn.ReLU(),
                                      nn.Conv2d(6, 16, 3), nn.MaxPool2d(2), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                        nn.Linear(84, 10))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class FashionImages(Dataset):
    """A torchvision-style dataset: uint8 images in memory, one float tensor per ``__getitem__``."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images = (images * 255).round().to(torch.uint8)      # as the IDX file holds them
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i].float().div_(255), int(self.labels[i])


class FloatImages(Dataset):
    """The in-memory float tensors, read one sample at a time: dptrain's Dataset machinery alone."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


class BatchedFashionImages(FashionImages):
    """The same, with ``__getitems__``: one read per batch (what a DataLoader calls when it exists)."""

    def __getitems__(self, indices):
        idx = torch.as_tensor(indices)
        return list(zip(self.images[idx].float().div_(255), self.labels[idx].tolist()))


def rate(result):
    """Training images/s of the last epoch (the first one warms up)."""
    last = result["history"][-1]
    return result["batch_size"] * BATCHES / last["sec"]


def measure(variants, repeats):
    rates = {k: [] for k in variants}
    names = list(variants)
    for rep in range(repeats + 1):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            r = variants[name]()
            if rep:
                rates[name].append(r)
    return rates


def paired(raw, a, b):
    return statistics.median(x / y for x, y in zip(raw[a], raw[b]))


def where_time_goes(data, n=4096):
    """Per-sample costs of the Dataset path, on this process's one thread."""
    ds = FashionImages(data.train_X[:n], data.train_y[:n])
    seeded = _Seeded(ds)
    plain, idx = list(range(n)), _Part(range(n))
    idx.seed = (0, 0, 0)
    timings = {}
    for name, fn in (("getitem", lambda: [ds[i] for i in plain]),
                     ("getitem + per-sample seeds", lambda: seeded.__getitems__(idx)),
                     ("collate (256 per batch)", lambda: [default_collate([ds[i] for i in range(k, k + 256)])
                                                          for k in range(0, n, 256)])):
        start = time.perf_counter()
        fn()
        timings[name] = (time.perf_counter() - start) / n * 1e6
    timings["collate (256 per batch)"] -= timings["getitem"]
    return {k: round(v, 2) for k, v in timings.items()}     # microseconds per sample


def main():
    global BATCHES
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    BATCHES = args.batches
    data = dptrain.load_dataset("fashion-mnist", args.data_dir)
    how = dict(devices="2", epochs=2, max_batches=args.batches, progress=False)

    def recipe(name):
        def run():
            config = TrainConfig(recipe=name, data_dir=args.data_dir, dataset="fashion-mnist", **how)
            torch.manual_seed(0)
            task = dataclasses.replace(RECIPES[name].make(config), eval_data=None)
            return rate(run_task(task, config, log=None))
        return run

    def user_module():
        torch.manual_seed(0)
        net = MyLeNet()
        result = dptrain.fit(net, (data.train_X, data.train_y), lr=0.04, batch_size=128, log=None,
                             init=dptrain.recipes.init_xavier, channels_last=True, **how)
        return rate(result)

    def with_workers(n, dataset=FashionImages(data.train_X, data.train_y)):
        def run():
            config = TrainConfig(recipe="lenet-scratch", data_dir=args.data_dir, num_workers=n, **how)
            torch.manual_seed(0)
            task = dataclasses.replace(RECIPES["lenet-scratch"].make(config), train_data=dataset, eval_data=None)
            return rate(run_task(task, config, log=None))
        return run

    variants = {
        "recipe lenet-mnist (fashion-mnist)": recipe("lenet-mnist"),
        "fit(MyLeNet, tensors)": user_module,
        "lenet-scratch, tensors in memory": recipe("lenet-scratch"),
        "lenet-scratch, Dataset, 0 workers": with_workers(0),
        "lenet-scratch, Dataset, 1 worker": with_workers(1),
        "lenet-scratch, Dataset, 2 workers": with_workers(2),
        "lenet-scratch, batched Dataset, 0 workers": with_workers(0, BatchedFashionImages(data.train_X, data.train_y)),
        "lenet-scratch, float Dataset, 0 workers": with_workers(0, FloatImages(data.train_X, data.train_y)),
    }
    raw = measure(variants, args.repeats)
    medians = {k: round(statistics.median(v)) for k, v in raw.items()}
    memory = "lenet-scratch, tensors in memory"
    ratios = {"fit(MyLeNet) / recipe": round(paired(raw, "fit(MyLeNet, tensors)",
                                                    "recipe lenet-mnist (fashion-mnist)"), 3)}
    for k in variants:
        if "Dataset" in k:
            ratios[f"{k} / in memory"] = round(paired(raw, k, memory), 3)
    out = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
                      f"torch {torch.__version__}",
           "command": "python benchmarks/bench_api.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                                  for k, v in vars(args).items() if v is not None),
           "images_per_sec_median": medians, "paired_ratios": ratios, "raw": raw,
           "dataset_path_us_per_sample": where_time_goes(data)}
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
