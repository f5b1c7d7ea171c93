"""The epoch loop of a run: train, evaluate, tell the callbacks, checkpoint; resume where a run stopped.

One loop serves every Task, built-in or the user's. Its outputs (epoch lines, progress bar,
metrics file, TensorBoard, trace) are callbacks (``callbacks/``), in the same list as the
user's, which see the ``Run`` below as ``run``. A checkpoint (``resume.py``) holds all a run
needs to go on; the data order of an epoch depends only on ``(seed, epoch)``. So a run
stopped after epoch k, or mid-epoch by SIGINT/SIGTERM (in every process at the same batch,
see ``stopping.py``), and resumed ends with the same parameters and metrics, bit for bit on
a CPU, as a run that was never stopped.
"""
from __future__ import annotations

import collections
import functools
import sys
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch

from ..callbacks.base import BatchEnd, CallbackList
from ..core import tracing
from ..core.devices import format_device
from ..core.runner import get_runner
from ..core.stage import noted, stage
from ..data.choose_loader import read_as_samples
from ..data.loader import prefetch
from ..data.lookahead import Lookahead
from ..distributed import DistEnv, get_collective
from ..engine import forward_hooks
from ..engine.evaluation import sum_keys
from ..engine.lightning_module import LightningSteps
from ..engine.losses import add_counts
from ..engine.task import Task
from ..parallel.model_edits import ModelEdits
from . import auto_devices, gradients, report, resume
from .agreement import what_it_trains
from .build import (build_balancer, build_engine, builtin_callbacks, planned_counts, renormalised_in_forward,
                    run_ahead, torch_sync_batchnorm, train_mode)
from .config import TrainConfig, hyperparameters
from .resume import Position
from .step_limit import Cut, StepLimit, ends_here, epochs_for, resume_cut, steps_done
from .schedule import Schedule, make_scheduler
from .step_log import StepLog, log_step
from .stopping import GO_ON, StopRequests, act_on, say_at_once
from .tally import Tally
from .time_limit import TimeLimit
from .view import RunView

Log = Callable[[str], None]


def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for queued GPU work, so timings cover it (a no-op on CPU devices)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


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
        elif isinstance(task.step, LightningSteps) and task.step.lr_scheduler_step is not None:
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
            sec, loss_sum, count, figures, skipped, stopped = self._train_epoch(epoch)
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

    def _train_epoch(self, epoch: int) -> Tuple[float, Any, Any, List[Any], int, bool]:
        at = self.position if epoch == self.position.epoch else Position(epoch)
        skipped_at_start = self.skipped - at.skipped
        first_step = (epoch - 1) * self.batches if self.batches is not None else self.step - at.batch
        self.train_loader.set_epoch(epoch - 1, first_step if self.batches is None else None)
        self.batch = at.batch + 1           # a failure from here on names the batch trained next
        self.schedule.epoch_start(epoch)
        self.callbacks.on_epoch_start(self, epoch)
        edits = self.edits
        edits.after("in on_epoch_start")
        watch = self.watch_batches
        synchronize(self.devices)
        start = time.perf_counter()
        tally = Tally(self.devices[0], on_host=self.run_ahead == 0 and all(d.type == "cpu" for d in self.devices),
                      group=self.run_ahead, figures=self.engine.train_figures, resumed_at=at.batch)
        batches = self.train_loader.batches(at.batch)
        if any(d.type == "cuda" for d in self.devices) and getattr(self.train_loader, "device", None) is None \
                and getattr(self.train_loader, "num_workers", 1) > 0:
            # The next batch is gathered while the GPUs compute. Not on CPU devices: there
            # the gathering would take its core time from the devices all the same; nor from
            # tensors kept on the GPU (a few kernels queued), nor from a Dataset read in this
            # process (its collate is Python, which a thread cannot run beside the loop's):
            # there a thread only adds hand-offs and contention for the interpreter.
            batches = prefetch(batches)
        skip_nan = self.config.on_nan == "skip"
        per_batch = self.schedule.per_batch
        # float16's loss scale wants the step's global samples (loss_scale.py)
        global_size = self.train_loader.global_batch_size if self.engine.loss_scale is not None else None
        # --balance with accumulation: each micro-batch of a group split by the update's weights
        sizes_of = getattr(self.train_loader, "global_batch_sizes", self.train_loader.global_batch_size)
        every = self.config.checkpoint_every
        tell, ask, grads_told = self.callbacks.wants("on_batch_end"), self.callbacks.wants("on_batch_start"), \
            self.grads_told
        ending = [False]
        last = self.limit.last_batch(first_step, self.batches)
        step_log = self.step_log
        if step_log is not None:
            step_log.epoch_start(tally)
        clocked = self.clock.seconds is not None

        def so_far(b: int) -> Position:    # what a save mid-epoch keeps
            loss_sum, count = tally.numbers()
            return Position(epoch, b, at.loss_sum + loss_sum, at.count + count, at.seconds + time.perf_counter() - start,
                            self.skipped - skipped_at_start, tally.figure_numbers(at.figures))
        # On GPUs the host runs one step ahead: what a step says about itself (a NaN loss, the
        # processes' summed stop flags) is read once the next step is queued, so the host never
        # waits for the device inside a step. On CPU devices there is nothing to wait for.
        pending: Deque[Tuple[int, torch.Tensor, Optional[torch.Tensor]]] = collections.deque()

        def resolve(keep: int, latest: int) -> None:
            while len(pending) > keep:
                done, verdict, received = pending.popleft()
                bad = not skip_nan and not Tally.finite(verdict)
                decision = self.stops.after_batch(done, bad, received)
                if decision is not GO_ON:
                    ending[0] |= act_on(self, decision, epoch, latest, so_far, itself())
        # Weakly: a function holding itself is a reference cycle, which kept this run (its
        # model copies, optimizer, buckets: GPU memory too) alive after fit until Python's
        # collector ran (a test checks it is freed at once).
        itself = weakref.ref(resolve)
        lightning = self.task.step.at if isinstance(self.task.step, LightningSteps) else None
        module_step = self.task.step.optimizer_step if isinstance(self.task.step, LightningSteps) else None
        with self.runner.coordinating():
            b = at.batch
            stream = tracing.timed_batches(batches) if self.config.trace else batches
            # An open-ended stream's end is known a batch ahead (see data/lookahead.py).
            ahead = Lookahead(stream) if self.batches is None else None
            for b, batch in enumerate(ahead or stream, start=at.batch + 1):
                self.step, self.batch = first_step + b - 1, b
                if lightning is not None:
                    lightning(b - 1, epoch - 1, self.step, batch)   # (a LightningModule's batch_idx, its trainer's)
                if ask:
                    self.callbacks.on_batch_start(self, epoch, b)
                    if watch:
                        edits.after("in on_batch_start")
                flags = self.stops.before_batch()        # they ride with the gradients
                sizes = timed = None
                if self.balancer is not None:
                    sizes = self.balancer.local_sizes(self.step, sizes_of(b - 1))
                    timed = self.balancer.measuring(self.step)
                step = functools.partial(self.engine.train_batch, batch, skip_nonfinite=skip_nan, extras=flags,
                                         sizes=sizes, timed=bool(timed), global_size=global_size and global_size(b - 1))
                # (a LightningModule's own optimizer_step makes the update)
                result = step() if module_step is None else \
                    module_step(self.engine.trainer.optimizer, epoch - 1, b, self.train_loader, step)
                if watch and edits.several:     # one device: nothing to copy edits to
                    edits.stepped()
                if b == at.batch + 1 and epoch == self.position.epoch and self.engine.random.draws:   # the first step found it
                    self.log(f"dptrain: the model draws random numbers outside nn.Dropout layers (F.dropout, "
                             f"torch.rand...): on {len(self.devices)} CPU devices their forward passes run one after "
                             f"another, so that runs repeat; nn.Dropout layers draw from each device's own stream")
                if self.balancer is not None:
                    if timed:
                        self.balancer.observe(result.seconds, sizes[-1] if isinstance(sizes[0], list) else sizes)
                    self.balancer.after_step(self.step, self.collective)
                verdict = result.loss
                if result.counted:          # (an fp16 overflow: no update, its loss counts)
                    verdict = tally.add(result)
                    if per_batch:
                        self.schedule.after_batch(first_step + b)
                elif skip_nan:           # the engine skipped it in every process
                    self.skipped += 1
                self.step = first_step + b
                end = BatchEnd(epoch, b, self.batches, self.step, self.train_loader.global_batch_size(b - 1), result,
                               tally) if tell or grads_told else None
                self.batch_end = end
                if grads_told:
                    gradients.tell(self, end)
                    edits.after("in on_gradients")
                if step_log is not None:
                    log_step(self, tally, epoch, b, result)
                if tell:
                    self.callbacks.on_batch_end(self, end)
                    if watch:
                        edits.after("in on_batch_end")
                if clocked and self.clock.up():
                    self.stops.time_up()        # (rides with the next batch's gradients)
                pending.append((b, verdict, result.flags))
                resolve(self.run_ahead, b)
                if ending[0] or b >= last or (ahead is not None and ahead.ended):
                    break
                if every and b % every == 0 and (ahead is not None or b < self.batches):
                    resolve(0, b)
                    resume.save_mid_epoch(self, so_far(b))
                self.batch = b + 1          # the batch read next (a failure while reading names it)
            resolve(0, b)
            ending[0] |= act_on(self, self.stops.flush(), epoch, b, so_far, resolve)
        edits.stepped()
        if ahead is not None and b == at.batch == 0:
            raise ValueError(f"{type(self.train_loader.dataset).__name__} yielded no sample in pass {epoch}: a stream "
                             f"must yield samples every pass (without __len__, an epoch is what a pass yields)")
        self.epoch_batches = b
        part_way = not ahead.ended if ahead is not None else b < self.batches
        ending[0] |= ends_here(self, epoch, b, first_step + b, part_way, so_far)
        if lightning is not None:
            lightning(b, epoch - 1, first_step + b)     # (its trainer, evaluating: the epoch's updates done)
        synchronize(self.devices)
        if step_log is not None:
            step_log.epoch_end(tally)
        loss_sum, count = tally.totals()
        return (at.seconds + time.perf_counter() - start, at.loss_sum + loss_sum, add_counts(at.count, count),
                tally.figure_totals(at.figures), self.skipped - skipped_at_start, ending[0])
