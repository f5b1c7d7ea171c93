"""One batch's work on the devices of a process: its shards, each device's forward and
backward, and what they add up to (the loss sum and its denominator); and what a whole
step did (``StepResult``).

``ModelEngine.train_batch`` makes one plan per batch (per micro-batch when gradients are
accumulated) and hands ``plan.compute`` to the ``Trainer``, which runs it on every device's
thread and sums the gradients.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

from ..core import tracing as trace
from ..data.batch import Batch, to_device
from ..parallel.syncbn import synchronized
from ..parallel.sync.base import Extras
from .losses import Count, add_counts, host_number

_ALONE = contextlib.nullcontext()       # (shared: a step makes no new object)


@dataclass
class StepResult:
    """What one training step did (``ModelEngine.train_batch``).

    ``loss``: this process's loss sum, a float64 0-d tensor on the first device (NaN if the
    step was skipped), or its mean when ``mean`` (the direct step of one device: the sum is
    ``loss * count``, not computed unless asked); ``count``: what the sum is divided by
    (samples for a sum loss; a tensor for a weighted loss); ``stepped``: whether the
    parameters were updated; ``flags``: the processes' sum of the ``extras`` sent with the
    gradients (None if none rode); ``seconds``: each device's forward and backward time when
    the step was ``timed``; ``grad_norm``: the global gradient norm before clipping (with
    ``clip_grad_norm``; a 0-d tensor; several optimizers: each update's, by name);
    ``overflow``: not stepped because float16's scaled gradients overflowed
    (``loss_scale.py``): its loss is finite, and it counts as a step.
    """
    loss: torch.Tensor
    count: Count
    stepped: bool = True
    flags: Extras = None
    seconds: Optional[List[float]] = None
    grad_norm: Union[torch.Tensor, Dict[str, torch.Tensor], None] = None
    mean: bool = False
    overflow: bool = False

    @property
    def counted(self) -> bool:
        """Whether its loss and figures count in the epoch's (an update, or an fp16 overflow)."""
        return self.stepped or self.overflow

    def numbers(self) -> Tuple[float, float]:
        """``(loss sum, count)`` as numbers on the host (waits for the device)."""
        value, count = self.loss.item(), float(self.count)
        return (value * count if self.mean else value), count


class Turns:
    """The devices' forward passes one after another, in device order, for a model with forward
    hooks of the user's (``forward_hooks.py``: each step reads its own device's outputs), or one
    that draws random numbers (dropout) on several CPU devices of a process: they share one CPU
    generator, so concurrent forwards would take its numbers in whatever order the threads
    run, and no run could be repeated or resumed exactly. In turn, device ``i`` always draws
    the ``i``-th part: the same masks in every run, and a checkpoint's generator state
    resumes them. The backward passes (no draws) still run at once.

    ``decide``: given on the first step of a model not yet known to draw, the last device
    tells it whether the step drew (the generator is read before the first forward and after
    the last, which no other thread draws between)."""

    def __init__(self, n: int, decide: Optional[Callable[[bool], None]] = None,
                 read: Callable[[], torch.Tensor] = torch.default_generator.get_state):
        self.events = [threading.Event() for _ in range(n)]
        self.events[0].set()
        self.decide, self.read = decide, read       # (read: not while a random layer has its stream in it)
        self.before = read() if decide is not None else None

    def wait(self, i: int) -> None:
        self.events[i].wait()

    def pass_on(self, i: int) -> None:
        if i + 1 < len(self.events):
            self.events[i + 1].set()
        elif self.decide is not None:
            self.decide(not torch.equal(self.before, self.read()))


class StepPlan:
    """``shards[i]``: device ``i``'s part of the batch (None: it has none and adds zeros);
    ``n``: the batch's samples; ``known``: whether ``count`` (the denominator) was known
    from the batch alone, else each shard counts its own in ``compute``."""

    def __init__(self, engine: Any, shards: List[Optional[Batch]], n: int, known: bool, count: Count,
                 step: Optional[Callable] = None):
        self.engine, self.shards, self.n, self.known, self.count = engine, shards, n, known, count
        self.step = step            # an update's step function (several optimizers), else the task's
        self.scored = True          # whether compute adds to the training figures (train_metrics)
        devices = engine.devices
        self.counts: List[Count] = [None] * len(devices)
        self.seconds = [0.0] * len(devices)
        draws = engine.random.draws        # (and a model with forward hooks of the user's: forward_hooks.py)
        self.turns = None if draws is False and not engine.hooked else Turns(
            len(devices), engine.random.decide if draws is None else None, engine.random.generator_state)

    def compute(self, timed: bool) -> Callable[[int], torch.Tensor]:
        """``compute(i)``: forward and backward of shard ``i`` on device ``i``; its loss sum."""
        engine = self.engine
        scale = engine.loss_factor      # float16: what the loss sums are scaled by (loss_scale.py)
        gathering = engine.gathering    # a whole_batch loss's exchange of parts (whole_batch.py), or None

        def compute(i: int) -> torch.Tensor:
            shard = self.shards[i]
            turns = self.turns
            if shard is None:
                if turns is not None:
                    turns.wait(i)
                    turns.pass_on(i)
                if gathering is not None:
                    gathering.idle(i)
                return engine._idle(i)
            device = engine.devices[i]
            start = time.perf_counter()
            if turns is not None:
                turns.wait(i)
            try:
                with trace.span("forward", i), torch.enable_grad(), synchronized(), \
                        (_ALONE if gathering is None else gathering.part(i)):       # BatchNorm, loss across devices
                    value, self.counts[i] = engine._loss(engine._net(i), to_device(shard, device,
                                                                                   engine.memory_format),
                                                         device, count=not self.known,
                                                         scored=i if self.scored else None, step=self.step)
            except BaseException:
                engine.abort_exchanges()        # (the others may wait for this device's part)
                raise
            finally:
                if turns is not None:
                    turns.pass_on(i)
            with trace.span("backward", i):
                try:
                    (value if scale is None else value * scale).backward()
                except BaseException:
                    engine.abort_exchanges()
                    raise
            if timed:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                self.seconds[i] = time.perf_counter() - start
            return value.detach()
        return compute

    def shard_counts(self) -> Count:
        """The denominator as the shards counted it (once every shard has computed)."""
        total = None
        for c in self.counts:
            total = add_counts(total, host_number(c))
        return total

    def denominator(self, before: Count) -> Count:
        """The known denominator, added to ``before`` (the micro-batches' so far)."""
        return add_counts(before, self.count)

    def loss(self, outputs: List[torch.Tensor]) -> torch.Tensor:
        """The devices' loss sums, added in float64 on the first device."""
        first = self.engine.devices[0]
        return outputs[0].double() if len(outputs) == 1 else sum(v.double().to(first) for v in outputs)
