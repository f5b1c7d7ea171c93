"""The epoch loop of a run: train, evaluate, tell the callbacks, checkpoint; resume where a run stopped.

One loop serves every Task, built-in or the user's (an epoch's steps: ``epoch_steps.py``).
Its outputs (epoch lines, progress bar, metrics file, TensorBoard, trace) are callbacks
(``callbacks/``), in the same list as the user's, which see the ``Run`` below as ``run``. A
checkpoint (``resume.py``) holds all a run needs to go on; the data order of an epoch
depends only on ``(seed, epoch)``. So a run stopped after epoch k, or mid-epoch by
SIGINT/SIGTERM (in every process at the same batch, see ``stopping.py``), and resumed ends
with the same parameters and metrics, bit for bit on a CPU, as a run that was never stopped.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..callbacks.base import BatchEnd, CallbackList
from ..core.devices import format_device
from ..core.runner import get_runner
from ..core.stage import noted, stage
from ..data.choose_loader import read_as_samples
from ..distributed import DistEnv, get_collective
from ..engine import forward_hooks
from ..engine.evaluation import sum_keys
from ..engine.lightning_module import LightningSteps
from ..engine.task import Task
from ..parallel.model_edits import ModelEdits
from . import auto_devices, gradients, report, resume
from .agreement import what_it_trains
from .build import (build_balancer, build_engine, builtin_callbacks, planned_counts, renormalised_in_forward,
                    run_ahead, torch_sync_batchnorm, train_mode)
from .config import TrainConfig, hyperparameters
from .epoch_steps import train_epoch
from .resume import Position
from .step_limit import Cut, StepLimit, epochs_for, resume_cut, steps_done
from .schedule import Schedule, make_scheduler
from .step_log import StepLog
from .stopping import StopRequests, say_at_once
from .time_limit import TimeLimit
from .view import RunView

Log = Callable[[str], None]


class Run(RunView):
    """One training run of a Task: built from the config, then ``run()`` epoch by epoch.
    What callbacks see of it is ``RunView`` (``view.py``)."""

    def __init__(self, task: Task, config: TrainConfig, env: DistEnv, devices: List[torch.device],
                 backend: Optional[str], log: Optional[Log]):
        self.task, self.config, self.env, self.devices, self.backend = task, config, env, devices, backend
        self.clock = TimeLimit(config.max_time)     # (a job's time: set-up counts)
        self.timed_out = False                      # every process decided max_time is up
        self.rank, self.world_size, self.is_main = env.rank, env.world_size, env.rank == 0
        self.log: Log = log or (lambda _: None)
        counted = self.clock.counted_from()
        if counted:
            self.log(counted)
        self.collective = get_collective()
        self.epochs, self.batch_size, self.lr = hyperparameters(task, config, len(devices))
        if task.configured_later:       # (a LightningModule's: it may read estimated_stepping_batches)
            with stage("calling the model's configure_optimizers"):
                task.configure_later(planned_counts(task, config, env, devices, self.batch_size, self.epochs))
        train_mode(task.model, self.log)
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if log is not None else self.log
        # devices auto on a CPU: virtual devices only if they pay
        self.task, self.devices = task, devices = auto_devices.pick(task, config, devices, env.distributed,
                                                                    self.batch_size, self.epochs, self.log, say)
        renormalised_in_forward(task.model, len(devices) * self.world_size, self.log)
        self.config = config = torch_sync_batchnorm(task.model, config, len(devices) * self.world_size, self.log)
        self.device_names = [format_device(d) for d in devices]
        first, outputs = builtin_callbacks(config, env)     # before any work: a missing package is said now
        self.kvstore, self.engine, self.train_loader, self.eval_loader, self.other_evals = build_engine(
            task, config, env, devices, self.batch_size, self.lr, self.log, self.epochs)
        self.lr = self.engine.trainer.learning_rate
        # What callbacks do to run.model (and which of its layers train), on every device.
        self.edits = ModelEdits(self.engine.replicas, self.engine.trainer, forward_hooks.followed(self.engine, self.log))
        # An epoch's batches; None: an open-ended stream's (read to its end, counted as they come).
        self.batches: Optional[int] = None if getattr(self.train_loader, "open_ended", False) \
            else len(self.train_loader)
        self.limit = StepLimit(config.max_steps)
        self.epochs_from_steps = self.epochs is None
        if self.epochs is None:        # max_steps, and no epochs given: as many as its updates need
            self.epochs = epochs_for(config.max_steps, self.batches)
        self.cut: Optional[Cut] = None     # where max_steps or max_time ended an epoch mid-way
        self.step_log = StepLog(self.collective, list(task.updates)) \
            if config.log_every_n_steps or config.eval_every_n_steps else None
        if config.eval_every_n_steps and self.eval_loader is None:
            raise ValueError("eval_every_n_steps needs an evaluation set: give eval_data (or validation_split)")
        with stage("making the learning-rate scheduler"):
            self.scheduler = make_scheduler(task.scheduler, self.engine.trainer.optimizer)
        self.schedule = Schedule(self.scheduler, task.scheduler_interval, config.eval_every_n_steps,
                                 task.scheduler_monitor)
        if task.manual:         # (the module's training_step steps them: self.lr_schedulers())
            self.schedule.hold()
        elif isinstance(task.step, LightningSteps):
            self.schedule.lightning_order()
            if task.step.lr_scheduler_step is not None:
                self.schedule.stepped_by(task.step.lr_scheduler_step)
        if isinstance(task.step, LightningSteps) and task.step.clock is not None:     # (self.optimizers() reads)
            task.step.clock.lend(self.engine.trainer.optimizer, self.scheduler, task.scheduler_interval,
                                 task.scheduler_monitor)
        self.runner = get_runner(devices)
        self.history: List[Dict[str, Any]] = []
        self.position = Position()
        self.skipped = 0
        self.epoch, self.step, self.batch = 1, 0, 0
        self.epoch_batches = 0                       # the batches the latest epoch trained (from its first)
        self._loaded = self._evaluated = None        # see load_weights
        # eval_every_n_steps: (step, this process's sums, the other sets' figures) of the latest
        self._step_evals: Optional[Tuple[int, Any, Dict[str, Any]]] = None
        # ... told of each (on_fit_start may add: step_log.py), and whether the epoch's evaluation of the same weights
        # reuses it (not where a LightningModule's validation hooks keep what validation_step gives: they run again)
        self.step_evaluation_hooks: List[Any] = []
        self.reuse_step_evaluation = True
        self.evaluated_epoch = False                 # whether the latest epoch was evaluated (eval_every)
        self.batch_end: Optional[BatchEnd] = None    # the latest update's, as the callbacks are told of it
        self.run_ahead = run_ahead(devices)
        figures = self.engine.train_figures       # train_metrics: the sums behind train_acc...
        self.figure_keys: List[str] = figures.keys if figures is not None else []
        # Said at once, by rank 0 (the elastic agent passes a signal on, and says nothing).
        announce = say_at_once if self.is_main else None
        self.stops = StopRequests(self.collective, announce, config.checkpoint_dir)
        self.stop_reason: Optional[str] = None
        self.balancer = build_balancer(config, self.collective, devices, self.train_loader, env.rank)
        self.callbacks = CallbackList(first + list(task.callbacks) + outputs)
        users = CallbackList(list(task.callbacks))      # (dptrain's outputs edit no model)
        self.plain_steps = True         # (tests turn it off: every step then takes the watched way)
        self.plain_epoch = False        # whether the latest epoch's steps took the plain way
        self.watch_batches = any(users.wants(hook) for hook in ("on_batch_start", "on_gradients", "on_batch_end",
                                                                "on_train_log"))
        self.grads_told = gradients.keep_for(self)
        resume.own_random_streams(config.seed, env.rank, devices)     # dropout masks differ by rank
        if config.resume:                                               # (and this restores them)
            with stage(f"resuming from {config.checkpoint_dir}"):
                state, position = resume.resume(self)
                self.step = steps_done(position, self.batches, state.get("steps"))
                self.position = resume_cut(self, state, position)
        self.epoch = self.position.epoch

    def identity(self) -> Dict[str, Any]:
        return {"recipe": self.task.name, "dataset": self.task.dataset, "batch_size": self.batch_size,
                "seed": self.config.seed, "devices": self.device_names, "world_size": self.world_size,
                "lr": self.lr, "kvstore": self.kvstore, "shuffle": self.config.shuffle,
                **what_it_trains(self.task, self.train_loader)}

    def close(self) -> None:
        """Stop the data loaders' worker processes, if any, and detach from the model."""
        for loader in (self.train_loader, self.eval_loader, *self.other_evals.values()):
            if hasattr(loader, "close"):
                loader.close()
        try:        # (which gives the user's optimizer object the state training reached)
            self.engine.close()
        except Exception as e:      # noqa: BLE001 - never in place of the error that ended the run
            self.log(f"dptrain: closing the run (its gradient hooks, your optimizer's state given back) failed: "
                     f"{type(e).__name__}: {e}; the model is trained")

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        keys = sum_keys(self.engine) if self.eval_loader is not None else []
        self.schedule.check_start(self)
        with stage("running the callbacks' on_fit_start"):
            self.callbacks.on_fit_start(self)
        try:
            held = self.schedule.held_from      # (a callback holds the scheduler from then: SWA)
            last = self.epochs if held is None else min(self.epochs, held - 1)
            self.schedule.check_length(*self.limit.left(self.step, self.position.epoch, last, self.batches), self.log)
            with self.stops.catching():
                first = self.epochs + 1 if self.limit.reached(self.step) else self.position.epoch
                if self.step_log is not None:
                    self.step_log.start(self.step)
                for epoch in range(first, self.epochs + 1):
                    self.epoch = epoch
                    if self._epoch(epoch, keys):
                        break
                if self.epochs_from_steps and self.batches is None:     # (open-ended: those it had)
                    self.epochs = self.epoch
        except BaseException as e:
            self.callbacks.on_exception(self, e)
            raise
        result = report.result_of(self)
        with stage("running the callbacks' on_fit_end"):
            self.callbacks.on_fit_end(self, result)
        self.log(report.closing_line(result))
        return result

    def _epoch(self, epoch: int, keys: List[str]) -> bool:
        """Train, evaluate, tell the callbacks and save one epoch; whether the run stops here."""
        with stage(lambda: f"training epoch {epoch}, batch {self.batch}"), \
                noted(lambda: read_as_samples(self.train_loader) if self.step == 0 else None):
            sec, loss_sum, count, figures, skipped, stopped = train_epoch(self, epoch)
        evals: Dict[str, Any] = {}
        others: Dict[str, Any] = {}
        self.evaluated_epoch = self.eval_loader is not None and (
            epoch % self.config.eval_every == 0 or epoch == self.epochs or stopped)
        if not self.evaluated_epoch:
            keys = []
        else:
            with stage(f"evaluating after epoch {epoch}"):
                self._loaded = None
                self.callbacks.on_evaluate_start(self, epoch)
                edited = self.edits.after("in on_evaluate_start", always=True)
                self._evaluated = self._loaded
                same = (self._loaded is None and not edited and self._step_evals is not None
                        and self._step_evals[0] == self.step and self.reuse_step_evaluation)
                evals = self._step_evals[1] if same else self.engine.evaluate(self.eval_loader)
                others = self._step_evals[2] if same else report.other_sets(self.engine, self.other_evals,
                                                                             self.collective)
        row = report.row_of(self, epoch, sec, [loss_sum, count] + figures, skipped, evals, keys, others)
        with stage(f"ending epoch {epoch} (callbacks and scheduler)"):
            if self.evaluated_epoch:      # (told even when the set was empty)
                self.callbacks.on_evaluate_end(self, epoch, {k: v for k, v in row.items() if k.startswith("test_")})
            self.history.append(row)
            self.callbacks.on_epoch_end(self, epoch, row)     # (first: a plateau may watch what they add)
            self.schedule.after_epoch(row, self.evaluated_epoch, self.eval_loader is not None)
        if self.clock.up():
            self.stops.time_up()
        asked, late = self.stops.agree()
        if late and not stopped and epoch < self.epochs:
            self.stop_reason, self.timed_out = self.stop_reason or self.clock.reason(f"after epoch {epoch}"), True
        stopped = stopped or asked or (late and epoch < self.epochs)
        with stage(f"saving after epoch {epoch}"):
            if self.cut is not None:       # mid-epoch: a resumed run goes on from there
                resume.save_mid_epoch(self, self.cut.position, self.cut)
            else:
                resume.save(self, Position(epoch + 1), [[0.0, 0.0]] * self.world_size)
        if stopped:
            self.log(f"stopped after epoch {epoch}: {self.stop_reason or 'a callback on another process asked'}")
        return stopped
