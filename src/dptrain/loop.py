"""The epoch loop of a run: train, evaluate, log, checkpoint; resume where a run stopped.

A checkpoint holds the model, the optimizer state, the epoch and batch reached, the partial
loss sum, the history and the RNG state; the data order of an epoch depends only on
``(seed, epoch)``. So a run stopped after epoch k, or mid-epoch by SIGINT/SIGTERM (in every
process at the same batch, see ``stopping.py``), and resumed ends with the same parameters
and metrics, bit for bit on a CPU, as a run that was never stopped.
"""
from __future__ import annotations

import json
import math
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .checkpoint import CheckpointError, checkpoint_path, load_checkpoint, save_checkpoint
from .config import TrainConfig
from .data import ArrayLoader, load_dataset
from .data.loader import prefetch
from .devices import format_device
from .distributed import DistEnv, get_collective
from .evaluate import count_correct
from .metrics import MetricsLog
from .parallel import get_runner
from .progress import ProgressBar
from .stopping import StopRequests
from .tensorboard import TensorBoardLog
from .recipes import RECIPES, hyperparameters

Log = Callable[[str], None]


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; the state was saved (if a checkpoint directory was given)."""


class NonFiniteLoss(ValueError):
    """The loss became NaN or infinite (``--on-nan stop``)."""


def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for queued GPU work, so timings cover it (a no-op on CPU devices)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


class Run:
    """One training run: built from the config, then ``run()`` epoch by epoch."""

    def __init__(self, config: TrainConfig, env: DistEnv, devices: List[torch.device],
                 backend: Optional[str], log: Optional[Log]):
        self.config, self.env, self.devices, self.backend = config, env, devices, backend
        self.log = log or (lambda _: None)
        self.recipe = RECIPES[config.recipe]
        self.collective = get_collective()
        self.epochs, self.batch_size, self.lr = hyperparameters(config, len(devices))
        total_devices = len(devices) * env.world_size
        if self.batch_size < total_devices:
            raise ValueError(f"batch size {self.batch_size} is smaller than the {total_devices} devices: "
                             f"use --batch-size {total_devices} or more, or fewer --devices")
        self.metrics = MetricsLog(config.metrics) if config.metrics and env.rank == 0 else None
        self.board = TensorBoardLog(config.tensorboard) if config.tensorboard and env.rank == 0 else None
        torch.manual_seed(config.seed)
        self.engine = self.recipe.build(config, devices, self.lr)   # before the data: fail fast
        data = load_dataset(config.dataset or self.recipe.dataset, config.data_dir)
        self.dataset = data.name
        shard = dict(rank=env.rank, world_size=env.world_size)
        self.train_loader = ArrayLoader(data.train_X, data.train_y, self.batch_size, shuffle=True,
                                        seed=config.seed, max_batches=config.max_batches, **shard)
        self.test_loader = ArrayLoader(data.test_X, data.test_y, self.batch_size,
                                       max_batches=config.eval_batches, **shard)
        self.runner = get_runner(devices)
        self.history: List[Dict[str, Any]] = []
        self.position = (1, 0, 0.0, 0.0)       # epoch, batches done in it, loss sum, seconds
        self.skipped = 0
        self.stops = StopRequests(self.collective)
        if config.resume:
            self._resume()

    # -- checkpoints -------------------------------------------------------------------
    def _identity(self) -> Dict[str, Any]:
        return {"recipe": self.recipe.name, "dataset": self.dataset, "batch_size": self.batch_size,
                "seed": self.config.seed, "devices": len(self.devices), "world_size": self.env.world_size}

    def _save(self, epoch: int, batch: int, loss_sums: List[float], seconds: float) -> None:
        """Rank 0 writes; ``loss_sums`` holds every process's partial loss sum of the epoch."""
        if not self.config.checkpoint_dir or self.env.rank != 0:
            return
        save_checkpoint(self.config.checkpoint_dir, {
            "identity": json.dumps(self._identity()), "epoch": epoch, "batch": batch,
            "loss_sums": loss_sums, "seconds": seconds, "skipped": self.skipped,
            "history": json.dumps(self.history), "engine": self.engine.state_dict(),
            "rng": torch.get_rng_state()})

    def _resume(self) -> None:
        if not self.config.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir DIR (where the checkpoint is)")
        state = load_checkpoint(self.config.checkpoint_dir)
        saved, ours = json.loads(state["identity"]), self._identity()
        different = {k: (saved.get(k), v) for k, v in ours.items() if saved.get(k) != v}
        if different:
            what = ", ".join(f"{k} {a!r} (this run: {b!r})" for k, (a, b) in different.items())
            raise CheckpointError(f"the checkpoint in {self.config.checkpoint_dir} is of another run: {what}; "
                                  f"resume with the same settings, or use another --checkpoint-dir")
        try:
            self.engine.load_state_dict(state["engine"])
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"cannot resume from {checkpoint_path(self.config.checkpoint_dir)}: {e}") from None
        torch.set_rng_state(state["rng"])
        self.history = json.loads(state["history"])
        self.skipped = state["skipped"]
        self.position = (state["epoch"], state["batch"], state["loss_sums"][self.env.rank], state["seconds"])
        self.log(f"resumed from {checkpoint_path(self.config.checkpoint_dir)} at epoch {state['epoch']}, "
                 f"batch {state['batch']}")

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        first_epoch = self.position[0]
        with self.stops.catching():
            for epoch in range(first_epoch, self.epochs + 1):
                sec, loss_sum = self._train_epoch(epoch)
                correct, count = count_correct(self.engine.predictors(), self.test_loader, self.devices)
                totals = self.collective.all_reduce(torch.tensor([loss_sum, correct, count], dtype=torch.float64))
                row = {"epoch": epoch, "sec": sec,
                       "train_loss": totals[0].item() / self.train_loader.global_num_samples,
                       "test_acc": totals[1].item() / totals[2].item()}
                self.history.append(row)
                self._save(epoch + 1, 0, [0.0] * self.env.world_size, 0.0)
                record = {**row, "recipe": self.recipe.name, "devices": self._names(),
                          "world_size": self.env.world_size,
                          "images_per_sec": self.train_loader.global_num_samples / sec}
                for log in (self.metrics, self.board):
                    if log:
                        log.append(record)
                self.log(f"epoch {epoch}, {sec:.1f} sec, train loss {row['train_loss']:.3f}, "
                         f"test acc {row['test_acc']:.3f}")
        return self._result()

    def _train_epoch(self, epoch: int) -> Tuple[float, float]:
        resume_epoch, done, loss_before, sec_before = self.position
        skip = done if epoch == resume_epoch else 0
        if epoch != resume_epoch:
            loss_before, sec_before = 0.0, 0.0
        self.train_loader.set_epoch(epoch - 1)
        bar = ProgressBar(len(self.train_loader), epoch, enabled=self.config.progress and self.env.rank == 0)
        synchronize(self.devices)
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.devices[0])
        images = 0
        batches = self.train_loader.batches(skip)
        if any(d.type == "cuda" for d in self.devices):
            # The next batch is gathered while the GPUs compute. Not on CPU devices: there
            # the gathering would take its core time from the devices all the same.
            batches = prefetch(batches)
        skip_nan = self.config.on_nan == "skip"

        def so_far() -> Tuple[float, float]:    # loss sum and seconds of the epoch, for a save
            return loss_before + loss_sum.item(), sec_before + time.perf_counter() - start
        with self.runner.coordinating():
            b = skip
            for b, (X, y) in enumerate(batches, start=skip + 1):
                self.stops.before_batch()
                loss = self.engine.train_batch(X, y, self.lr, skip_nonfinite=skip_nan,
                                               global_size=self.train_loader.global_batch_size(b - 1))
                finite = bool(torch.isfinite(loss))
                if finite:
                    loss_sum += loss
                elif skip_nan:           # the engine skipped it in every process
                    self.skipped += 1
                images += len(X)
                if bar.enabled:
                    bar.update(b, images * self.env.world_size, loss_sum.item() / max(images, 1))
                self._decide(self.stops.after_batch(b, not finite and not skip_nan), bar, epoch, b, so_far)
            self._decide(self.stops.flush(), bar, epoch, b, so_far)
        bar.close()
        synchronize(self.devices)
        return sec_before + time.perf_counter() - start, loss_before + loss_sum.item()

    def _decide(self, decision: Tuple[Optional[int], Optional[int]], bar: ProgressBar, epoch: int,
                batch: int, so_far: Callable[[], Tuple[float, float]]) -> None:
        """Act on what every process decided after ``batch``: go on, stop for NaN, or save and stop."""
        signum, bad_batch = decision
        if bad_batch is None and signum is None:
            return
        bar.close()
        if bad_batch is not None:
            kept = f"; the last good checkpoint is kept in {self.config.checkpoint_dir}" \
                if self.config.checkpoint_dir else ""
            raise NonFiniteLoss(f"the loss became NaN or infinite at epoch {epoch}, batch {bad_batch}: lower "
                                f"--lr, or pass --on-nan skip to skip such batches{kept}")
        self._interrupt(signum, epoch, batch, *so_far())

    def _interrupt(self, signum: int, epoch: int, batch: int, loss_sum: float, seconds: float) -> None:
        # Every process stops after the same batch; each keeps its own partial loss sum.
        sums = self.collective.all_gather(torch.tensor([loss_sum], dtype=torch.float64))
        self._save(epoch, batch, [t.item() for t in sums], seconds)
        self.stops.barrier()            # nobody leaves (and gets the others stopped) before the save
        name = signal.Signals(signum).name
        where = (f"; saved to {checkpoint_path(self.config.checkpoint_dir)}: continue with --resume"
                 if self.config.checkpoint_dir else " (no --checkpoint-dir: nothing saved)")
        raise Interrupted(f"stopped by {name} at epoch {epoch}, batch {batch}{where}")

    def _names(self) -> List[str]:
        return [format_device(d) for d in self.devices]

    def _result(self) -> Dict[str, Any]:
        config, recipe, history = self.config, self.recipe, self.history
        names = self._names()
        seconds = sum(h["sec"] for h in history)
        result = {
            "recipe": recipe.name, "devices": names, "world_size": self.env.world_size,
            "epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": config.seed,
            "dataset": self.dataset,
            **({"optimizer": config.optimizer or recipe.optimizer,
                "kvstore": "dist" if self.env.distributed else config.kvstore,
                "sync_bn": config.sync_bn, "amp": config.amp}
               if recipe.uses_trainer else {"allreduce": config.allreduce}),
            **({"backend": self.backend} if self.backend else {}),
            **({"skipped_batches": self.skipped} if config.on_nan == "skip" else {}),
            "test_acc": history[-1]["test_acc"] if history else math.nan,
            "sec_per_epoch": seconds / max(len(history), 1),
            "images_per_sec": self.train_loader.global_num_samples * len(history) / seconds if seconds else 0.0,
            "history": history,
        }
        where = f"[{', '.join(names)}]"
        if self.env.distributed:
            where = f"{self.env.world_size} processes x {where}"
        self.log(f"test acc: {result['test_acc']:.2f}, {result['sec_per_epoch']:.1f} sec/epoch on {where}")
        return result
