"""Training on a stream: samples read from shard files as they come, as WebDataset and
Hugging Face's streaming datasets read them: one file.

    python examples/train_on_a_stream.py                         # writes the shards, then trains
    python examples/train_on_a_stream.py --num-workers 2         # shards read in 2 worker processes
    python examples/train_on_a_stream.py --checkpoint-dir runs/stream          # Ctrl-C, then --resume
    dptrain launch --processes 2 examples/train_on_a_stream.py   # 2 processes (torchrun works too)

``Shards`` is an ``IterableDataset``: each pass visits the shard files in an order drawn from
its ``set_epoch`` (dptrain calls it before each pass) and yields their samples; with workers,
each reads every ``num_workers``-th shard (``get_worker_info``). Every process reads the whole
stream and keeps its part of each global batch, so the processes need no sharding of their
own. An epoch is ``--steps-per-epoch`` batches of the stream, which runs on across epochs.
"""
from __future__ import annotations

import argparse
import functools
import os
import tempfile
from typing import Iterator, List, Tuple

import torch
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

import dptrain


def write_shards(directory: str, shards: int = 8, per_shard: int = 500) -> List[str]:
    """``shards`` files of ``per_shard`` samples: 16 features, 4 classes (made once)."""
    os.makedirs(directory, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 4, generator=g)
    paths = []
    for k in range(shards):
        path = os.path.join(directory, f"shard-{k:03d}.pt")
        x = torch.randn(per_shard, 16, generator=g)
        if not os.path.exists(path):                             # (every process may write it: the same bytes)
            tmp = f"{path}.{os.getpid()}.tmp"
            torch.save({"x": x, "y": (x @ w).argmax(1)}, tmp)
            os.replace(tmp, path)                                # whole or absent
        paths.append(path)
    return paths


class Shards(IterableDataset):
    """The samples of ``paths``, shard by shard, the shards in an order drawn from the epoch."""

    def __init__(self, paths: List[str]):
        self.paths, self.epoch = paths, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(self.paths), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        worker = get_worker_info()
        if worker is not None:                                   # each worker its share of the shards
            order = order[worker.id::worker.num_workers]
        for k in order:
            shard = torch.load(self.paths[k], weights_only=True)
            yield from zip(shard["x"], shard["y"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards-dir", default=os.path.join(tempfile.gettempdir(), "dptrain-example-shards"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    paths = write_shards(args.shards_dir)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    held_out = torch.load(paths[0], weights_only=True)      # (its first 200 samples: a stand-in evaluation set)
    return dptrain.fit(model, Shards(paths), (held_out["x"][:200], held_out["y"][:200]), batch_size=100,
                       steps_per_epoch=args.steps_per_epoch, epochs=args.epochs, num_workers=args.num_workers,
                       optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), shuffle=False, devices=args.devices,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume)


if __name__ == "__main__":
    main()
