"""The epoch loop of a run: train, evaluate, log, checkpoint; resume where a run stopped.

One loop serves every Task, built-in or the user's. A checkpoint holds the model, the
optimizer and scheduler state, the epoch and batch reached, the partial loss sums, the
history and the RNG state; the data order of an epoch depends only on ``(seed, epoch)``. So
a run stopped after epoch k, or mid-epoch by SIGINT/SIGTERM (in every process at the same
batch, see ``stopping.py``), and resumed ends with the same parameters and metrics, bit for
bit on a CPU, as a run that was never stopped.
"""
from __future__ import annotations

import collections
import os
import signal
import sys
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch

from ..outputs.checkpoint import checkpoint_path
from .config import TrainConfig
from ..data.dataset_loader import make_loader
from ..data.loader import TensorLoader, prefetch
from ..distributed import DistEnv, get_collective
from ..engine.model_engine import ModelEngine
from ..engine.losses import add_counts
from ..outputs.metrics_file import MetricsLog
from .preflight import check_space
from ..core.runner import get_runner
from ..outputs.progress import ProgressBar
from .config import hyperparameters
from .report import Reporting
from .resume import Resumable, has_batchnorm
from ..core import tracing
from ..core.errors import Interrupted, NonFiniteLoss
from ..outputs import trace
from ..engine.balance import Balancer
from .stopping import StopRequests
from ..engine.task import Task
from ..outputs.tensorboard import TensorBoardLog

Log = Callable[[str], None]




def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for queued GPU work, so timings cover it (a no-op on CPU devices)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


class Run(Resumable, Reporting):
    """One training run of a Task: built from the config, then ``run()`` epoch by epoch."""

    def __init__(self, task: Task, config: TrainConfig, env: DistEnv, devices: List[torch.device],
                 backend: Optional[str], log: Optional[Log]):
        self.task, self.config, self.env, self.devices, self.backend = task, config, env, devices, backend
        self.log = log or (lambda _: None)
        self.collective = get_collective()
        self.epochs, self.batch_size, self.lr = hyperparameters(task, config, len(devices))
        total_devices = len(devices) * env.world_size
        if self.batch_size < total_devices:
            raise ValueError(f"batch size {self.batch_size} is smaller than the {total_devices} devices: "
                             f"use --batch-size {total_devices} or more, or fewer --devices")
        if config.sync_bn and not has_batchnorm(task.model):
            raise ValueError(f"--sync-bn: {task.name}'s model has no BatchNorm layer; drop --sync-bn")
        self.board = TensorBoardLog(config.tensorboard, fresh=config.overwrite) \
            if config.tensorboard and env.rank == 0 else None
        self.kvstore = task.kvstore if config.kvstore is None else config.kvstore_kind
        channels_last = config.channels_last if config.channels_last is not None else task.channels_last and (
            all(d.type == "cpu" for d in devices) or config.amp is not None)
        self.engine = ModelEngine(task, devices, kvstore=self.kvstore, sync_batchnorm=config.sync_bn,
                                  amp=config.amp_dtype, channels_last=channels_last,
                                  bucket_cap_mb=config.bucket_mb, compile=config.compile)
        shard = dict(rank=env.rank, world_size=env.world_size, num_workers=config.num_workers,
                     collate_fn=task.collate_fn, pin_memory=any(d.type == "cuda" for d in devices))
        self.train_loader = make_loader(task.load("train_data"), self.batch_size, shuffle=True, seed=config.seed,
                                        max_batches=config.max_batches, **shard)
        eval_data = task.load("eval_data")
        self.eval_loader = make_loader(eval_data, self.batch_size, max_batches=config.eval_batches, **shard) \
            if eval_data is not None else None
        self._keep_on_device(devices[0])
        self.engine.prepare(self.train_loader.example(), self.lr)
        self.lr = self.engine.trainer.learning_rate
        if self.engine.compile_mode:    # on the shard sizes of an epoch: a full batch, and the last one
            for first in {0, len(self.train_loader) - 1}:
                self.engine.compile(next(iter(self.train_loader.batches(first))))
            self.log(f"compiled in {self.engine.compile_seconds:.1f} sec (--compile {self.engine.compile_mode})")
        if env.rank == 0:           # room for a checkpoint: model, optimizer state, a margin
            size = sum(t.numel() * t.element_size() for t in self.engine.state_dict()["model"].values())
            check_space(config.checkpoint_dir, 3 * size + 2**20)
        self.scheduler = task.scheduler(self.engine.trainer.optimizer) if task.scheduler else None
        self.runner = get_runner(devices)
        self.history: List[Dict[str, Any]] = []
        # epoch, batches done in it, loss sum and denominator so far, seconds, batches skipped in it
        self.position: Tuple[int, int, float, float, float, int] = (1, 0, 0.0, 0.0, 0.0, 0)
        self.skipped = 0
        # Steps the host runs ahead of what it has read back (see _train_epoch): 1 on GPUs.
        # DPTRAIN_RUN_AHEAD=0|1 overrides it (the tests run the GPU bookkeeping on CPUs).
        ahead = os.environ.get("DPTRAIN_RUN_AHEAD", "")
        self.run_ahead = int(ahead) if ahead.isdigit() else int(any(d.type == "cuda" for d in devices))
        # Said at once, by rank 0 (the elastic agent passes a signal on, and says nothing).
        announce = (lambda line: print(line, file=sys.stderr, flush=True)) if env.rank == 0 else None
        self.stops = StopRequests(self.collective, announce, config.checkpoint_dir)
        self.balancer: Optional[Balancer] = None
        if config.balance != "even":
            per_rank = [int(t.item()) for t in self.collective.all_gather(torch.tensor([len(devices)]))]
            # New sizes take effect a few steps on: past what a loader prepared ahead.
            self.balancer = Balancer(config.balance, per_rank, env.rank, lag=max(3, 2 * config.num_workers + 2),
                                     gpu=any(d.type == "cuda" for d in devices))
            self.train_loader.balancer = self.balancer
        self.trace = trace.Window(config.trace, config.trace_steps, self.epochs * len(self.train_loader), env.rank,
                                  self._names(), self.collective, self.log, from_step=config.trace_from) \
            if config.trace else None
        if config.resume:
            self._resume()
        self.metrics = MetricsLog(config.metrics_file, [self._record(row) for row in self.history]) \
            if config.metrics_file and env.rank == 0 else None

    def _keep_on_device(self, device: torch.device) -> None:
        """On a GPU, tensors held in memory move there once (if they take at most a quarter
        of its free memory): each batch is then gathered on the GPU, with no host copy."""
        if device.type != "cuda":
            return
        free = torch.cuda.mem_get_info(device)[0]
        for loader in (self.train_loader, self.eval_loader):
            if isinstance(loader, TensorLoader) and loader.nbytes <= free // 4:
                loader.to(device)
                free -= loader.nbytes

    def close(self) -> None:
        """Stop the data loaders' worker processes, if any, and detach from the model."""
        for loader in (self.train_loader, self.eval_loader):
            if hasattr(loader, "close"):
                loader.close()
        self.engine.trainer.close()

    # -- the loop ----------------------------------------------------------------------
    def _eval_keys(self) -> List[str]:
        """The sums evaluation gives, the same in every process (for one all_reduce)."""
        if self.eval_loader is None:
            return []
        keys = ["loss", "count"] + (["correct", "correct_count"] if self.engine.classification else [])
        return keys + [k for name in self.task.metrics for k in (name, f"{name}_count")]

    def run(self) -> Dict[str, Any]:
        first_epoch = self.position[0]
        keys = self._eval_keys()
        with self.stops.catching():
            for epoch in range(first_epoch, self.epochs + 1):
                sec, loss_sum, count, skipped = self._train_epoch(epoch)
                evals = self.engine.evaluate(self.eval_loader) if self.eval_loader is not None else {}
                zero = torch.zeros((), dtype=torch.float64, device=self.devices[0])
                local = [torch.as_tensor(v, dtype=torch.float64, device=self.devices[0]).reshape(())
                         for v in (loss_sum, count)] + [evals.get(k, zero) for k in keys]
                totals = self.collective.all_reduce(torch.stack(local)).tolist()
                row = self._row(epoch, sec, totals[0], totals[1], dict(zip(keys, totals[2:])))
                if self.config.on_nan == "skip":       # the loss above covers the batches not skipped
                    row["skipped"] = skipped
                self.history.append(row)
                if self.scheduler is not None and self.task.scheduler_interval == "epoch":
                    self._step_scheduler(row)
                self._save(epoch + 1, 0, [[0.0, 0.0]] * self.env.world_size, 0.0)
                record = self._record(row)
                for log in (self.metrics, self.board):
                    if log:
                        log.append(record)
                self.log(self._line(row))
        if self.trace is not None:        # the run was shorter than the trace
            self.trace.finish()
        return self._result()

    def _step_scheduler(self, row: Optional[Dict[str, Any]] = None) -> None:
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            if row is not None:         # it needs a metric: the test loss, else the train loss
                self.scheduler.step(row.get("test_loss", row["train_loss"]))
            return
        self.scheduler.step()

    def _train_epoch(self, epoch: int) -> Tuple[float, Any, Any, int]:
        resume_epoch, done, loss_before, count_before, sec_before, skipped_before = self.position
        skip = done if epoch == resume_epoch else 0
        if epoch != resume_epoch:
            loss_before, count_before, sec_before, skipped_before = 0.0, 0.0, 0.0, 0
        skipped_at_start = self.skipped - skipped_before
        self.train_loader.set_epoch(epoch - 1)
        bar = ProgressBar(len(self.train_loader), epoch, enabled=self.config.progress and self.env.rank == 0)
        synchronize(self.devices)
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.devices[0])
        count: Any = 0
        images = 0
        batches = self.train_loader.batches(skip)
        if any(d.type == "cuda" for d in self.devices):
            # The next batch is gathered while the GPUs compute. Not on CPU devices: there
            # the gathering would take its core time from the devices all the same.
            batches = prefetch(batches)
        skip_nan = self.config.on_nan == "skip"
        per_batch = self.scheduler is not None and self.task.scheduler_interval == "batch"
        every = self.config.checkpoint_every

        def so_far() -> Tuple[float, float, float, int]:    # what a save mid-epoch keeps
            return (loss_before + loss_sum.item(), count_before + float(count),
                    sec_before + time.perf_counter() - start, self.skipped - skipped_at_start)
        # On GPUs the host runs one step ahead: what a step says about itself (a NaN loss, the
        # processes' summed stop flags) is read once the next step is queued, so the host never
        # waits for the device inside a step. On CPU devices there is nothing to wait for.
        pending: Deque[Tuple[int, torch.Tensor, Optional[torch.Tensor]]] = collections.deque()
        ahead = self.run_ahead

        def resolve(keep: int, latest: int) -> None:
            while len(pending) > keep:
                done, loss, received = pending.popleft()
                bad = not skip_nan and not bool(torch.isfinite(loss))
                self._decide(self.stops.after_batch(done, bad, received), bar, epoch, latest, so_far, resolve)
        batches = self._timed(batches)
        first_step = (epoch - 1) * len(self.train_loader)
        with self.runner.coordinating():
            b = skip
            for b, batch in enumerate(batches, start=skip + 1):
                step = first_step + b - 1
                if self.trace is not None:
                    self.trace.step(step)
                flags = self.stops.before_batch()        # they ride with the gradients
                sizes = timed = None
                if self.balancer is not None:
                    sizes = self.balancer.local_sizes(step, self.train_loader.global_batch_size(b - 1))
                    timed = self.balancer.measuring(step)
                result = self.engine.train_batch(batch, skip_nonfinite=skip_nan, extras=flags, sizes=sizes,
                                                 timed=bool(timed))
                loss, n = result.loss, result.count
                if self.balancer is not None:
                    if timed:
                        self.balancer.observe(result.seconds, sizes)
                    self.balancer.after_step(step, self.collective)
                if result.stepped:
                    loss_sum += loss                     # stays on the device: no wait
                    count = add_counts(count, n)
                    if per_batch:
                        self._step_scheduler()
                elif skip_nan:           # the engine skipped it in every process
                    self.skipped += 1
                images += self.train_loader.global_batch_size(b - 1)
                if bar.enabled:
                    bar.update(b, images, loss_sum.item() / max(float(count), 1e-12))
                pending.append((b, loss, result.flags))
                resolve(ahead, b)
                if every and b % every == 0 and b < len(self.train_loader):
                    resolve(0, b)
                    self._save_mid_epoch(epoch, b, *so_far())
            resolve(0, b)
            self._decide(self.stops.flush(), bar, epoch, b, so_far, resolve)
        bar.close()
        synchronize(self.devices)
        return (sec_before + time.perf_counter() - start, loss_before + loss_sum, add_counts(count_before, count),
                self.skipped - skipped_at_start)

    def _timed(self, batches):
        """The batches, with the wait for each recorded as ``data`` on the main track (--trace)."""
        it = iter(batches)
        while True:
            start = tracing.now_us()
            try:
                batch = next(it)
            except StopIteration:
                return
            tracing.event("data", "main", start, tracing.now_us())
            yield batch

    def _decide(self, decision: Tuple[Optional[int], Optional[int]], bar: ProgressBar, epoch: int,
                batch: int, so_far: Callable[[], Tuple[float, float, float, int]],
                resolve: Callable[[int, int], None]) -> None:
        """Act on what every process decided: go on, stop for NaN, or save after ``batch`` (the
        last batch done) and stop."""
        signum, bad_batch = decision
        if bad_batch is None and signum is None:
            return
        bar.close()
        if bad_batch is None:
            resolve(0, batch)           # what the steps still in flight say, before a save
        if bad_batch is not None:
            kept = f"; the last good checkpoint is kept in {self.config.checkpoint_dir}" \
                if self.config.checkpoint_dir else ""
            raise NonFiniteLoss(f"the loss became NaN or infinite at epoch {epoch}, batch {bad_batch}: lower "
                                f"--lr, or pass --on-nan skip to skip such batches{kept}")
        self._interrupt(signum, epoch, batch, *so_far())

    def _save_mid_epoch(self, epoch: int, batch: int, loss_sum: float, count: float, seconds: float,
                        skipped: int) -> None:
        """Save after ``batch`` of ``epoch``; every process keeps its own partial sums."""
        sums = self.collective.all_gather(torch.tensor([loss_sum, count], dtype=torch.float64))
        self._save(epoch, batch, [t.tolist() for t in sums], seconds, skipped)

    def _interrupt(self, signum: int, epoch: int, batch: int, loss_sum: float, count: float, seconds: float,
                   skipped: int) -> None:
        # Every process stops after the same batch.
        self._save_mid_epoch(epoch, batch, loss_sum, count, seconds, skipped)
        self.stops.barrier()            # nobody leaves (and gets the others stopped) before the save
        name = signal.Signals(signum).name
        where = (f"; saved to {checkpoint_path(self.config.checkpoint_dir)}: continue with --resume"
                 if self.config.checkpoint_dir else " (no --checkpoint-dir: nothing saved)")
        raise Interrupted(f"stopped by {name} at epoch {epoch}, batch {batch}{where}")
