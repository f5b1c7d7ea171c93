"""What a run says: each epoch's row (the history), its line, its metrics record, and the
run's result (what ``--json`` prints and ``fit`` returns), for ``loop.Run``."""
from __future__ import annotations

import math
from typing import Any, Dict, List

from ..core.devices import format_device


class Reporting:
    """The rows, lines and result of ``loop.Run`` (which gives the attributes used here)."""

    def _line(self, row: Dict[str, Any]) -> str:
        """``epoch 3, 7.9 sec, train loss 0.512, test loss 0.498, test acc 0.822[, 2 of 235
        batches skipped (loss not finite)]``."""
        line = f"epoch {row['epoch']}, {row['sec']:.1f} sec, " + ", ".join(
            f"{k.replace('_', ' ')} {v:.3f}" for k, v in row.items() if k not in ("epoch", "sec", "skipped", "split"))
        if "split" in row:
            line += f", split {'/'.join(map(str, row['split']))}"
        if row.get("skipped"):
            line += f", {row['skipped']} of {len(self.train_loader)} batches skipped (loss not finite)"
        return line

    def _record(self, row: Dict[str, Any]) -> Dict[str, Any]:
        """An epoch's line in the metrics file and TensorBoard."""
        return {**row, "recipe": self.task.name, "devices": self._names(), "world_size": self.env.world_size,
                "images_per_sec": self.train_loader.global_num_samples / row["sec"] if row["sec"] else 0.0}

    def _row(self, epoch: int, sec: float, loss: float, count: float, evals: Dict[str, float]) -> Dict[str, Any]:
        row = {"epoch": epoch, "sec": sec, "train_loss": loss / count if count else math.nan}
        if self.balancer is not None:    # each device's part of a full batch, now
            row["split"] = self.balancer.sizes(epoch * len(self.train_loader), self.batch_size)
        if evals:
            row["test_loss"] = evals["loss"] / evals["count"] if evals["count"] else math.nan
        if "correct" in evals:
            row["test_acc"] = evals["correct"] / evals["correct_count"] if evals["correct_count"] else math.nan
        for name in self.task.metrics if evals else ():
            row[f"test_{name}"] = evals[name] / evals[f"{name}_count"] if evals[f"{name}_count"] else math.nan
        return row

    def _names(self) -> List[str]:
        return [format_device(d) for d in self.devices]

    def _result(self) -> Dict[str, Any]:
        config, task, history = self.config, self.task, self.history
        names = self._names()
        seconds = sum(h["sec"] for h in history)
        optimizer = task.optimizer if isinstance(task.optimizer, str) else \
            type(self.engine.trainer._optimizers[0]).__name__
        result = {
            "recipe": task.name, "devices": names, "world_size": self.env.world_size,
            "epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": config.seed,
            "dataset": task.dataset, "optimizer": optimizer,
            "kvstore": "dist" if self.env.distributed else self.kvstore,
            "sync_bn": config.sync_bn, "amp": config.amp,
            **({"compile": self.engine.compile_mode, "compile_sec": self.engine.compile_seconds}
               if self.engine.compile_mode else {}),
            **({"backend": self.backend} if self.backend else {}),
            **({"skipped_batches": self.skipped} if config.on_nan == "skip" else {}),
            **({k: v for k, v in history[-1].items() if k.startswith("test_")} if history else {}),
            "train_loss": history[-1]["train_loss"] if history else math.nan,
            "sec_per_epoch": seconds / max(len(history), 1),
            "images_per_sec": self.train_loader.global_num_samples * len(history) / seconds if seconds else 0.0,
            "history": history,
        }
        where = f"[{', '.join(names)}]"
        if self.env.distributed:
            where = f"{self.env.world_size} processes x {where}"
        shown = ("test acc", result["test_acc"]) if "test_acc" in result else \
            ("test loss", result["test_loss"]) if "test_loss" in result else ("train loss", result["train_loss"])
        self.log(f"{shown[0]}: {shown[1]:.3f}, {result['sec_per_epoch']:.1f} sec/epoch on {where}")
        return result
