"""A run counted in updates, as language-model fine-tuning scripts count them: one file.

    python examples/finetune_in_steps.py                          # all GPUs, else the CPU
    python examples/finetune_in_steps.py --max-steps 300 --checkpoint-dir runs/steps
    python examples/finetune_in_steps.py --max-steps 600 --checkpoint-dir runs/steps --resume   # 300 more
    dptrain launch --processes 2 examples/finetune_in_steps.py    # 2 processes (torchrun works too)

A Hugging Face-style model (dict batches in, ``{"loss", "logits"}`` out) reads token
sequences of different lengths, padded by a ``collate_fn``, and says whether the sequence
holds more 7s than 9s. What the usual script writes by hand is ``fit``'s keywords here: AdamW with
a linear warm-up and decay over ``max_steps`` updates, gradient accumulation, clipping, the
training loss every ``log_every_n_steps``, an evaluation every ``eval_every_n_steps``, the
two best evaluations' weights kept (``BestCheckpoint(save_top_k=2)``).
"""
from __future__ import annotations

import argparse
import functools
from typing import Dict, List

import torch
from torch import nn
from torch.utils.data import Dataset

import dptrain
from dptrain.callbacks import BestCheckpoint

VOCAB, PAD = 32, 0


class Sequences(Dataset):
    """``n`` token sequences of 4-24 tokens; the label: more 7s than 9s?"""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(4, 25, (n,), generator=g)
        self.items = [torch.randint(1, 12, (int(k),), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        tokens = self.items[i]
        return {"input_ids": tokens, "labels": torch.tensor(int((tokens == 7).sum() > (tokens == 9).sum()))}


def pad(samples: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Pad a batch to its longest sequence, with the mask saying which tokens are real."""
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, :len(s["input_ids"])] = s["input_ids"]
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(),
            "labels": torch.stack([s["labels"] for s in samples])}


class Classifier(nn.Module):
    """Embeddings, one Transformer layer, a masked mean, a linear head: ``{"loss", "logits"}``."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width, padding_idx=PAD)
        self.layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        hidden = self.layer(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        logits = self.head((hidden * mask).sum(1) / mask.sum(1))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def warmup_then_linear(optimizer: torch.optim.Optimizer, warmup: int, total: int):
    """The usual schedule: up over ``warmup`` updates, then down to 0 at ``total``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (total - step) / (total - warmup))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--log-every", type=int, default=20, help="updates between two training-loss lines")
    parser.add_argument("--eval-every", type=int, default=50, help="updates between two evaluations")
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--resume", action="store_true", help="continue the run in --checkpoint-dir")
    parser.add_argument("--best", default="runs/steps-best-{step}.pt")
    args = parser.parse_args()
    torch.manual_seed(0)
    steps = args.max_steps
    result = dptrain.fit(
        Classifier(), Sequences(4096, seed=1), Sequences(512, seed=2), collate_fn=pad,
        optimizer=functools.partial(torch.optim.AdamW, lr=3e-3, weight_decay=0.01),
        scheduler=functools.partial(warmup_then_linear, warmup=max(1, steps // 10), total=steps),
        scheduler_interval="batch", batch_size=32, accumulate_grad_batches=2, clip_grad_norm=1.0,
        max_steps=steps, log_every_n_steps=args.log_every, eval_every_n_steps=args.eval_every,
        devices=args.devices, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
        callbacks=[BestCheckpoint(args.best, monitor="test_acc", save_top_k=2, overwrite=True)])
    if dptrain.rank() == 0:
        evaluations = [r for r in result["step_history"] if "test_acc" in r]
        print(f"steps: {result['step_history'][-1]['step']}, test acc by step: "
              + ", ".join(f"{r['step']}: {r['test_acc']:.3f}" for r in evaluations))


if __name__ == "__main__":
    main()
