"""Muon for a transformer's matrices, AdamW for the rest: two optimizers on one loss, in one fit call.

    python examples/muon.py                                  # all GPUs, else the CPU
    python examples/muon.py --adamw-only                     # AdamW for every parameter, to compare
    dptrain launch --processes 2 examples/muon.py            # 2 processes (torchrun works too)
    dptrain train --recipe examples/muon.py:make_task --devices 2 --epochs 3   # the Task, from the CLI

Muon (``torch.optim.Muon``, torch >= 2.9) orthogonalises the update of each hidden weight
matrix; the embedding, the output layer, the biases and the norms stay with AdamW, as
modded-nanoGPT splits them. ``optimizer`` is a dict of the two, each built on its parameters,
and one loss trains both: dptrain steps them as one ``dptrain.CombinedOptimizer`` (one
gradient sum, clipping over every parameter, checkpoints), and one scheduler, a warm-up and
a linear decay, scales every group's own rate. The rows give each one's (``lr_muon``,
``lr_adamw``).

The task: sequences of 24 tokens, labelled with whichever of the tokens 0-3 they hold most
of; a one-layer transformer reads them, averaged over the sequence.
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

import dptrain

VOCAB, LENGTH, CLASSES, DIM = 32, 24, 4, 64


class Reader(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layer = nn.TransformerEncoderLayer(DIM, 4, 2 * DIM, dropout=0.0, batch_first=True)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(tokens)).mean(1))


def sequences(n: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random tokens, the class's token planted a few extra times: it is the most frequent of 0-3."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(CLASSES, VOCAB, (n, LENGTH), generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    counts = torch.randint(1, 3, (n, CLASSES), generator=g)     # 1-2 of each of 0-3...
    counts[torch.arange(n), y] = 3                                # ...and 3 of the class's own
    for row in range(n):
        planted = torch.repeat_interleave(torch.arange(CLASSES), counts[row])
        tokens[row, torch.randperm(LENGTH, generator=g)[:len(planted)]] = planted
    return tokens, y


def optimizers(model: nn.Module, muon: bool = True) -> Dict[str, torch.optim.Optimizer]:
    """Muon for the hidden matrices; AdamW for the embedding, the head and every vector."""
    if not muon:
        return {"adamw": torch.optim.AdamW(model.parameters(), lr=3e-3)}
    if not hasattr(torch.optim, "Muon"):
        raise SystemExit("torch.optim.Muon needs torch >= 2.9: upgrade torch, or run with --adamw-only")
    matrices = [p for name, p in model.named_parameters() if p.ndim == 2 and name.startswith("layer.")]
    rest = [p for p in model.parameters() if all(p is not q for q in matrices)]
    return {"muon": torch.optim.Muon(matrices, lr=0.02, momentum=0.95),
            "adamw": torch.optim.AdamW(rest, lr=3e-3)}


def warm_up_and_decay(steps: int):
    """A scheduler factory: every group's rate rises over the first 10% of ``steps``, then
    falls linearly to a tenth (one function for all groups: each keeps its own scale)."""
    def factor(step: int) -> float:
        warm = max(1, steps // 10)
        return (step + 1) / warm if step < warm else max(0.1, 1 - 0.9 * (step - warm) / max(1, steps - warm))
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_task(config=None, samples: int = 4096, epochs: int = 3, muon: bool = True,
              batch_size: int = 128) -> dptrain.Task:
    """The run as a Task (``dptrain train --recipe examples/muon.py:make_task``; its
    ``--epochs`` sets the schedule's length too)."""
    epochs = getattr(config, "epochs", None) or epochs
    torch.manual_seed(0)
    model = Reader()
    steps = (samples // batch_size) * epochs
    return dptrain.Task(model, sequences(samples, seed=1), sequences(1024, seed=2),
                        optimizer=optimizers(model, muon), scheduler=warm_up_and_decay(steps),
                        scheduler_interval="batch", batch_size=batch_size, epochs=epochs, name="muon")


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--adamw-only", action="store_true", help="AdamW for every parameter")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    task = make_task(samples=args.samples, epochs=args.epochs, muon=not args.adamw_only)
    return dptrain.fit(task.model, task.train_data, task.eval_data, optimizer=task.optimizer,
                       scheduler=task.scheduler, scheduler_interval=task.scheduler_interval,
                       batch_size=task.batch_size, epochs=task.epochs, devices=args.devices,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume)


if __name__ == "__main__":
    main()
