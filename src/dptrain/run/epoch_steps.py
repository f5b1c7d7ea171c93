"""One epoch's training steps of a run (``loop.py``'s ``Run``): each batch trained, counted and told.

The loop of a plain PyTorch program, plus what a run keeps per step: the epoch's loss
(``tally.py``), the stop requests of every process (a signal, a callback's, ``max_time``,
a NaN loss: ``stopping.py``), ``max_steps`` and mid-epoch checkpoints. When nothing listens
before a step (no ``on_batch_start``, ``--balance``, LightningModule, float16, edits to copy
over devices) a step is the engine's call alone, the *plain* way; otherwise the *watched*
way calls what listens around it. After a step, what is told of it (``on_batch_end``,
``on_gradients``, the step log) is called only when something listens. On one CPU device
the plain way made the tiny MLP's step ~5 us faster, of 240 (benchmarks/RESULTS.md, issue
22); both ways train the same numbers (tests/run/test_loop.py).

>>> sec, loss_sum, count, figures, skipped, stopped = train_epoch(run, epoch)
"""
from __future__ import annotations

import collections
import functools
import time
import weakref
from typing import Any, Deque, List, Optional, Sequence, Tuple

import torch

from ..callbacks.base import BatchEnd
from ..core import tracing
from ..data.loader import prefetch
from ..data.lookahead import Lookahead
from ..engine.lightning_module import LightningSteps
from ..engine.losses import add_counts
from ..engine.step_plan import StepResult
from . import gradients, resume
from .resume import Position
from .step_limit import ends_here
from .report import lr_figures
from .step_log import log_step
from .stopping import GO_ON, act_on
from .tally import Tally


def synchronize(devices: Sequence[torch.device]) -> None:
    """Wait for queued GPU work, so timings cover it (a no-op on CPU devices)."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def train_epoch(run: Any, epoch: int) -> Tuple[float, Any, Any, List[Any], int, bool]:
    """Train ``run``'s epoch ``epoch`` (from where a resumed run stopped in it); returns its
    seconds, loss sum and count, training figures' sums, skipped steps, and whether the run
    stops after it."""
    at = run.position if epoch == run.position.epoch else Position(epoch)
    skipped_at_start = run.skipped - at.skipped
    first_step = (epoch - 1) * run.batches if run.batches is not None else run.step - at.batch
    run.train_loader.set_epoch(epoch - 1, first_step if run.batches is None else None)
    run.batch = at.batch + 1           # a failure from here on names the batch trained next
    run.schedule.epoch_start(epoch)
    run.callbacks.on_epoch_start(run, epoch)
    edits = run.edits
    edits.after("in on_epoch_start")
    watch = run.watch_batches
    synchronize(run.devices)
    start = time.perf_counter()
    tally = Tally(run.devices[0], on_host=run.run_ahead == 0 and all(d.type == "cpu" for d in run.devices),
                  group=run.run_ahead, figures=run.engine.train_figures, resumed_at=at.batch)
    batches = run.train_loader.batches(at.batch)
    if any(d.type == "cuda" for d in run.devices) and getattr(run.train_loader, "device", None) is None \
            and getattr(run.train_loader, "num_workers", 1) > 0:
        # The next batch is gathered while the GPUs compute. Not on CPU devices: there
        # the gathering would take its core time from the devices all the same; nor from
        # tensors kept on the GPU (a few kernels queued), nor from a Dataset read in this
        # process (its collate is Python, which a thread cannot run beside the loop's):
        # there a thread only adds hand-offs and contention for the interpreter.
        batches = prefetch(batches)
    skip_nan = run.config.on_nan == "skip"
    per_batch = run.schedule.per_batch
    # float16's loss scale wants the step's global samples (loss_scale.py)
    global_size = run.train_loader.global_batch_size if run.engine.loss_scale is not None else None
    # --balance with accumulation: each micro-batch of a group split by the update's weights
    sizes_of = getattr(run.train_loader, "global_batch_sizes", run.train_loader.global_batch_size)
    every = run.config.checkpoint_every
    tell, ask, grads_told = run.callbacks.wants("on_batch_end"), run.callbacks.wants("on_batch_start"), \
        run.grads_told
    ending = [False]
    last = run.limit.last_batch(first_step, run.batches)
    step_log = run.step_log
    if step_log is not None:
        step_log.epoch_start(tally)
    clocked = run.clock.seconds is not None

    def so_far(b: int) -> Position:    # what a save mid-epoch keeps
        loss_sum, count = tally.numbers()
        return Position(epoch, b, at.loss_sum + loss_sum, at.count + count, at.seconds + time.perf_counter() - start,
                        run.skipped - skipped_at_start, tally.figure_numbers(at.figures))
    # On GPUs the host runs one step ahead: what a step says about itself (a NaN loss, the
    # processes' summed stop flags) is read once the next step is queued, so the host never
    # waits for the device inside a step. On CPU devices there is nothing to wait for.
    pending: Deque[Tuple[int, torch.Tensor, Optional[torch.Tensor]]] = collections.deque()

    def resolve(keep: int, latest: int) -> None:
        while len(pending) > keep:
            done, verdict, received = pending.popleft()
            bad = not skip_nan and not Tally.finite(verdict)
            decision = run.stops.after_batch(done, bad, received)
            if decision is not GO_ON:
                ending[0] |= act_on(run, decision, epoch, latest, so_far, itself())
    # Weakly: a function holding itself is a reference cycle, which kept this run (its
    # model copies, optimizer, buckets: GPU memory too) alive after fit until Python's
    # collector ran (a test checks it is freed at once).
    itself = weakref.ref(resolve)
    lightning = run.task.step.at if isinstance(run.task.step, LightningSteps) else None
    loaded = run.task.step.loaded if lightning is not None and run.task.step.before is not None else None
    module_step = run.task.step.optimizer_step if isinstance(run.task.step, LightningSteps) else None
    clipping = run.task.step.clipping if isinstance(run.task.step, LightningSteps) else None
    # The random-draws notice after the run's first step (several CPU devices decide then)
    notice = epoch == run.position.epoch and run.engine.random.draws is not False
    # Plain: nothing to do before a step but the step (no on_batch_start, balancer, LightningModule,
    # float16 size, edits to copy): the loop then makes just the call a plain loop makes, a step
    # costing ~5 us less of the tiny MLP's 240 (benchmarks/RESULTS.md, issue 22). Either way the
    # same steps train the same numbers (tests/run/test_loop.py compares the two). After a step,
    # only what is told of it (tell_of) is called.
    plain = run.plain_steps and lightning is None and module_step is None and not ask and not notice \
        and run.balancer is None and global_size is None and not (watch and edits.several)
    run.plain_epoch, told = plain, tell or grads_told or step_log is not None
    train_batch, stops = run.engine.train_batch, run.stops
    last_update = lightning is not None and run.schedule.at_last_update
    rates = functools.partial(lr_figures, run.engine.trainer)

    def watched_step(b: int, batch: Any) -> StepResult:
        """A step, with what listens around it: hooks, --balance, a LightningModule's own calls."""
        if loaded is not None:              # (its on_before_batch_transfer: the batch every hook then sees)
            batch = loaded(batch)
        if lightning is not None:
            lightning(b - 1, epoch - 1, run.step, batch)   # (a LightningModule's batch_idx, its trainer's)
        if ask:
            run.callbacks.on_batch_start(run, epoch, b)
            if watch:
                edits.after("in on_batch_start")
        if clipping is not None:            # (a LightningModule's configure_gradient_clipping: this update's)
            run.engine.clip_grad_norm, run.engine.clip_grad_value = clipping(run.engine.trainer.optimizer,
                                                                             run.config.log_grad_norm)
        flags = stops.before_batch()        # they ride with the gradients
        sizes = timed = None
        if run.balancer is not None:
            sizes = run.balancer.local_sizes(run.step, sizes_of(b - 1))
            timed = run.balancer.measuring(run.step)
        step = functools.partial(train_batch, batch, skip_nonfinite=skip_nan, extras=flags,
                                 sizes=sizes, timed=bool(timed), global_size=global_size and global_size(b - 1))
        # (a LightningModule's own optimizer_step makes the update)
        result = step() if module_step is None else \
            module_step(run.engine.trainer.optimizer, epoch - 1, b, run.train_loader, step)
        if watch and edits.several:     # one device: nothing to copy edits to
            edits.stepped()
        if notice and b == at.batch + 1 and run.engine.random.draws:   # the first step found it
            run.log(f"dptrain: the model draws random numbers outside nn.Dropout layers (F.dropout, "
                    f"torch.rand...): on {len(run.devices)} CPU devices their forward passes run one after "
                    f"another, so that runs repeat; nn.Dropout layers draw from each device's own stream")
        if run.balancer is not None:
            if timed:
                run.balancer.observe(result.seconds, sizes[-1] if isinstance(sizes[0], list) else sizes)
            run.balancer.after_step(run.step, run.collective)
        return result

    def tell_of(b: int, result: StepResult) -> None:
        """The update, told: on_gradients, the step log, on_batch_end."""
        end = BatchEnd(epoch, b, run.batches, run.step, run.train_loader.global_batch_size(b - 1), result,
                       tally) if tell or grads_told else None
        run.batch_end = end
        if grads_told:
            gradients.tell(run, end)
            edits.after("in on_gradients")
        if step_log is not None:
            log_step(run, tally, epoch, b, result)
        if tell:
            run.callbacks.on_batch_end(run, end)
            if watch:
                edits.after("in on_batch_end")
    run.batch_end = None
    with run.runner.coordinating():
        b = at.batch
        stream = tracing.timed_batches(batches) if run.config.trace else batches
        # An open-ended stream's end is known a batch ahead (see data/lookahead.py).
        ahead = Lookahead(stream) if run.batches is None else None
        for b, batch in enumerate(ahead or stream, start=at.batch + 1):
            run.step, run.batch = first_step + b - 1, b
            result = train_batch(batch, skip_nonfinite=skip_nan, extras=stops.before_batch()) if plain \
                else watched_step(b, batch)
            verdict = result.loss
            if result.counted:          # (an fp16 overflow: no update, its loss counts)
                verdict = tally.add(result)
                if per_batch:
                    run.schedule.after_batch(first_step + b)
            elif skip_nan:           # the engine skipped it in every process
                run.skipped += 1
            run.step = first_step + b
            if last_update and (b == run.batches if ahead is None else ahead.ended):
                run.schedule.after_last_update(run.step, rates)     # (Lightning's order: before its on_train_batch_end)
            if told:
                tell_of(b, result)
            if clocked and run.clock.up():
                stops.time_up()        # (rides with the next batch's gradients)
            pending.append((b, verdict, result.flags))
            resolve(run.run_ahead, b)
            if ending[0] or b >= last or (ahead is not None and ahead.ended):
                break
            if every and b % every == 0 and (ahead is not None or b < run.batches):
                resolve(0, b)
                resume.save_mid_epoch(run, so_far(b))
            run.batch = b + 1          # the batch read next (a failure while reading names it)
        resolve(0, b)
        ending[0] |= act_on(run, run.stops.flush(), epoch, b, so_far, resolve)
    edits.stepped()
    if ahead is not None and b == at.batch == 0:
        raise ValueError(f"{type(run.train_loader.dataset).__name__} yielded no sample in pass {epoch}: a stream "
                         f"must yield samples every pass (without __len__, an epoch is what a pass yields)")
    run.epoch_batches = b
    part_way = not ahead.ended if ahead is not None else b < run.batches
    ending[0] |= ends_here(run, epoch, b, first_step + b, part_way, so_far)
    if lightning is not None:
        lightning(b, epoch - 1, first_step + b)     # (its trainer, evaluating: the epoch's updates done)
    synchronize(run.devices)
    if step_log is not None:
        step_log.epoch_end(tally)
    loss_sum, count = tally.totals()
    return (at.seconds + time.perf_counter() - start, at.loss_sum + loss_sum, add_counts(at.count, count),
            tally.figure_totals(at.figures), run.skipped - skipped_at_start, ending[0])
