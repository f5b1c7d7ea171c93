"""A LightningModule's manual optimization (``automatic_optimization = False``) on any devices and processes.

Lightning 2 trains several optimizers (a GAN) only this way: ``training_step`` steps them itself,

    opt_g, opt_d = self.optimizers()
    self.toggle_optimizer(opt_g)
    self.manual_backward(g_loss); opt_g.step(); opt_g.zero_grad()
    self.untoggle_optimizer(opt_g)

Under DDP each process's backward sums its gradients with the other processes'. Here each device's
copy of the module runs ``training_step`` on its part of the batch, in the device's thread, and
each ``opt.step()`` is an exchange: every device (of every process) gives that optimizer's
gradients and its samples (``manual_backward`` took its part's mean loss times its samples: a
sum), and every device gets their sum divided by the batch's samples, the whole batch's mean
gradient; then every device's optimizer (each updates all of its parameters) takes the same
step. So N devices train as one device on the whole batch, and as DDP's processes of equal
batches. One device of one process has nothing to sum: the plain loop's calls, as written.

``self.clip_gradients(opt, gradient_clip_val=v)`` clips at that optimizer's next step, the summed
gradient (Lightning clips the gradient DDP summed in backward); ``self.lr_schedulers()`` gives the
schedulers ``configure_optimizers`` built (held from fit's own stepping: the module steps them),
whose ``step()`` is a round of the exchange too, the scheduler stepped once a process;
``opt.zero_grad()``, ``self.toggle_optimizer``, ``untoggle_optimizer``, ``toggled_optimizer`` and
``opt.toggle_model()`` act on each device's copy; ``self.global_step`` counts every optimizer's
steps (Lightning's, with manual optimization; kept in checkpoints). Outside a training step (the
trial before training, an evaluation's loss) the step runs with gradients on and its calls that
would train do nothing (a WGAN-GP's penalty takes ``torch.autograd.grad`` there too).

On several CPU devices the copies run in turn between the exchanges, in device order (they share
one random generator: a GAN's noise is drawn in the same order every run). Every device and process
must step the same optimizers in the same order each batch: one that steps another, or returns
while the others step, is an error naming both, not a hang. A device (or a process) without a
sample of a short batch follows the others' exchanges with nothing, and keeps the gradients they
keep (the last round says which). Refused, as Lightning refuses them with manual
optimization: ``accumulate_grad_batches`` (step every N batches in the step), fit's
``clip_grad_norm``/``clip_grad_value`` (``self.clip_gradients``), ``amp='fp16'`` (no loss scale);
and a callback's ``on_gradients``, ``--balance``, an optimizer needing a closure.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, List, Optional, Tuple

import torch

from ..data.accumulate import MicroBatches
from ..data.batch import Batch, batch_size
from ..distributed.collective import get_collective
from ..distributed.env import DEFAULT_TIMEOUT_S
from ..parallel.syncbn import ThreadGroup
from .manual_calls import Part, ManualOptimization, local
from .step_plan import StepResult

_STEP, _SCHEDULE, _END, _FOLLOW = "step", "schedule", "end", "follow"
#: The device types whose copies take turns (one random generator for them all); on others (GPUs)
#: they run at once, and meet only in the rounds.
IN_TURN = ("cpu",)
_LATE = ("a device did not reach the optimizer's step in time: every device runs the same training_step, stepping "
         "the same optimizers in the same order; a device that failed says why above")


class _Turns:
    """The devices' code between two exchanges run one device after another, in device order."""

    def __init__(self, n: int):
        self.n, self.turn, self.broken = n, 0, False
        self.cond = threading.Condition()

    def wait(self, i: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.broken or self.turn == i, DEFAULT_TIMEOUT_S):
                raise RuntimeError(_LATE)
            if self.broken:
                raise threading.BrokenBarrierError

    def pass_on(self, i: int) -> None:
        with self.cond:
            self.turn = (i + 1) % self.n
            self.cond.notify_all()

    def abort(self) -> None:
        with self.cond:
            self.broken = True
            self.cond.notify_all()


class _Step:
    """One batch's exchanges (see the module docstring)."""

    def __init__(self, manual: ManualOptimization, engine: Any, skip_nonfinite: bool):
        self.manual, self.engine, self.skip_nonfinite = manual, engine, skip_nonfinite
        devices = engine.devices
        self.world = get_collective().world_size
        self.alone = len(devices) == 1 and self.world == 1
        self.turns = _Turns(len(devices)) if len(devices) > 1 and devices[0].type in IN_TURN else None
        if not self.alone and manual.group is None:     # (every process makes it at its first step, alike)
            manual.group = ThreadGroup(len(devices), collective=get_collective(new_group=True), late=_LATE)
        self.skipped = False

    def wait(self, i: int) -> None:
        if self.turns is not None:
            self.turns.wait(i)

    def abort(self) -> None:
        if self.manual.group is not None:
            self.manual.group.abort()
        if self.turns is not None:
            self.turns.abort()

    def exchange(self, part: Part, name: str) -> None:
        """Device ``part.i``'s ``opt.step()`` of optimizer ``name``."""
        trainer = self.manual.trainers.trainers[name]
        i, clip = part.i, part.clip.pop(name, None)
        if self.alone:
            trainer.optimizer.push(zip(trainer._optimizers, trainer._origins))     # (a scheduler's rates)
            self._update(trainer, 0, clip)
            trainer.optimizer.pull()
            self.manual.stepped()
            return
        params = trainer._groups[i]
        had = tuple(p.grad is not None for p in params)      # (in the head: no read of the device's for it)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params]
                         + [torch.full((1,), float(part.n), dtype=torch.float64, device=params[0].device)])
        head, total = self._share(i, (_STEP, name, clip, had), flat)
        self._apply(trainer, i, total, head)

    def schedule(self, part: Part, name: str, args: tuple, kwargs: dict) -> None:
        """Device ``part.i``'s ``sch.step(...)`` of optimizer ``name``'s scheduler: once a process."""
        if self.alone:
            self.manual.schedulers[name].step(*args, **kwargs)
            return
        args = tuple(float(a) if isinstance(a, torch.Tensor) and a.numel() == 1 else a for a in args)   # (a metric)
        self._share(part.i, (_SCHEDULE, name, (args, kwargs)), None)

    def end(self, i: int) -> None:
        """Device ``i``'s ``training_step`` returned: a last round, where every device must end,
        saying which parameters it left a gradient (a follower then keeps the same ones)."""
        if not self.alone:
            kept = tuple(p.grad is not None for p in self.engine.replicas[i].parameters())
            self._share(i, (_END, None, kept), None)

    def follow(self, i: int) -> None:
        """A device without a sample: the others' exchanges, with nothing of its own, to their end."""
        while True:
            head, total = self._share(i, (_FOLLOW, None, None), None)
            if head[0] == _END:         # (the others' zero_grad: its gradients as theirs, the exchanged ones)
                for p, kept in zip(self.engine.replicas[i].parameters(), head[2] or ()):
                    if not kept:
                        p.grad = None
                return
            if head[0] == _STEP:
                self._apply(self.manual.trainers.trainers[head[1]], i, total, head)

    def _share(self, i: int, head: Tuple[Any, ...], flat: Optional[torch.Tensor]) -> Tuple[Tuple[Any, ...], Any]:
        if self.turns is not None:
            self.turns.pass_on(i)
        out = self.manual.group.share(i, (head, flat), self._across)[0]
        if self.turns is not None and out[0][0] != _END:
            self.turns.wait(i)
        return out

    def _across(self, local: List[Tuple[Tuple[Any, ...], Any]]) -> List[Any]:
        """Thread 0, every device's ``(head, gradients)`` given: their agreed head and sum (over
        every process too), the learning rates pushed to every device's optimizer first."""
        head = _agreed([(f"device {k}", h) for k, (h, _) in enumerate(local)])
        collective = self.manual.group.collective
        if self.world > 1:
            gathered = collective.all_gather_object(head)
            head = _agreed([(f"process {r}", h) for r, h in enumerate(gathered)])
        for trainer in self.manual.trainers.trainers.values():
            trainer.optimizer.pull()        # (what the last steps changed of their groups)
        if head[0] == _SCHEDULE:        # (every thread waits: nothing else reads the rates now)
            args, kwargs = head[2]
            self.manual.schedulers[head[1]].step(*args, **kwargs)
        if head[0] != _STEP:
            return [(head, None)]
        trainer = self.manual.trainers.trainers[head[1]]
        trainer.optimizer.push(zip(trainer._optimizers, trainer._origins))
        self.manual.stepped()
        device = trainer._groups[0][0].device
        flats = [f.to(device) for h, f in local if h[0] == _STEP]
        if flats:
            total = torch.stack(flats).sum(0) if len(flats) > 1 else flats[0]
        else:
            total = torch.zeros(sum(p.numel() for p in trainer._groups[0]) + 1, dtype=torch.float64, device=device)
        if self.world > 1:
            total = torch.stack(collective.all_gather(total)).sum(0)
        return [(head, total)]

    def _apply(self, trainer: Any, i: int, total: torch.Tensor, head: Tuple[Any, ...]) -> None:
        """The summed gradient (over the batch's samples) into device ``i``'s copy, then its update
        (``head``: the round's clipping, and which parameters have a gradient on some device)."""
        params = trainer._groups[i]
        total = total.to(params[0].device)
        samples = total[-1]         # (a tensor: on a GPU, nothing waits for the device here)
        start = 0
        with torch.no_grad():
            for p, had in zip(params, head[3]):
                size = p.numel()
                if had:
                    mean = (total[start:start + size] / samples).view(p.shape).to(p.dtype)
                    if p.grad is None:
                        p.grad = mean
                    else:
                        p.grad.copy_(mean)
                start += size
        self._update(trainer, i, head[2])

    def _update(self, trainer: Any, i: int, clip: Optional[Tuple[str, float]]) -> None:
        grads = [p for p in trainer._groups[i] if p.grad is not None]
        if clip is not None and grads:
            if clip[0] == "norm":
                torch.nn.utils.clip_grad_norm_(grads, clip[1])
            else:
                torch.nn.utils.clip_grad_value_(grads, clip[1])
        if self.skip_nonfinite and grads and not all(bool(torch.isfinite(p.grad).all()) for p in grads):
            for p in grads:         # (the same sum on every device: each skips alike)
                p.grad = None
            self.skipped = True
            return
        trainer._optimizers[i].step()
        if i == 0:
            trainer.optimizer.mark()


def _agreed(heads: List[Tuple[str, Tuple[Any, ...]]]) -> Tuple[Any, ...]:
    """The one head of the devices (or processes) that are not following (all following: a
    follower's); a ValueError naming two that differ."""
    taking = [(who, h) for who, h in heads if h[0] != _FOLLOW]
    if not taking:
        return heads[0][1]
    first = taking[0]
    for who, h in taking[1:]:
        if h[:2] != first[1][:2]:
            raise ValueError(f"training_step stepped its optimizers differently on the devices and processes: "
                             f"{first[0]} {_said(first[1])}, {who} {_said(h)}; every one runs the same optimizer "
                             f"steps in the same order each batch (a step taken on a condition of the data must "
                             f"decide alike everywhere)")
    if first[1][0] != _STEP:
        return first[1]
    had = tuple(any(flags) for flags in zip(*(h[3] for _, h in taking)))     # (a gradient on any device)
    return (*first[1][:3], had)


def _said(head: Tuple[Any, ...]) -> str:
    return f"called optimizer {head[1]}'s step()" if head[0] == _STEP else \
        f"stepped optimizer {head[1]}'s scheduler" if head[0] == _SCHEDULE else "returned"


def check(engine: Any, batch: Batch, sizes: Any, timed: bool) -> None:
    """A ValueError for a setting a manual-optimization step cannot keep."""
    refused = ("accumulate_grad_batches > 1 (accumulate in training_step: step every N batches, if (batch_idx + 1) "
               "% N == 0: opt.step(); opt.zero_grad())" if isinstance(batch, MicroBatches) else
               "amp='fp16' (no loss scale with manual_backward: give amp='bf16')"
               if engine.loss_scale is not None else
               "clip_grad_norm or clip_grad_value (clip in training_step: self.clip_gradients(opt, "
               "gradient_clip_val=1.0) before opt.step())"
               if engine.clip_grad_norm is not None or engine.clip_grad_value is not None else
               "a callback's on_gradients (each opt.step() has its own gradient: read it in training_step)"
               if engine.trainer.keep_grads else
               "balance (the devices run their steps in turn)" if sizes is not None or timed else None)
    if refused:
        raise ValueError(f"the module turns Lightning's automatic_optimization off (its training_step steps its "
                         f"optimizers), which does not go with {refused}")


def manual_step(engine: Any, batch: Batch, skip_nonfinite: bool = False, sizes: Any = None,
                timed: bool = False) -> StepResult:
    """One batch of a manual-optimization module on this process's devices; the result's loss is
    what ``training_step`` returned (its mean over the batch), a sum of nothing where it returned
    none (the epoch's ``train_loss`` is then NaN; what it logs are the figures)."""
    check(engine, batch, sizes, timed)
    steps = engine.task.step
    manual = steps.manual
    step = _Step(manual, engine, skip_nonfinite)
    plan = engine._plan(batch, None)
    figures = engine.train_figures

    def on_device(i: int) -> Any:
        shard = plan.shards[i]
        n = batch_size(shard) if shard is not None else 0
        local.part = Part(step, i, n)
        try:
            if shard is None:
                if step.turns is not None:
                    step.turns.wait(i)
                step.follow(i)
                return None
            step.wait(i)
            net = engine._net(i)
            with engine._autocast(engine.devices[i]):
                out = steps.train_step(net, shard)
            if figures is not None:
                figures.add_step_output(i, net, shard, out if isinstance(out, dict) else None)
            step.end(i)
            return _loss_of(out), n
        except BaseException as e:      # noqa: BLE001 - handed back: the failed device's error is raised
            step.abort()
            return e
        finally:
            local.part = None

    with contextlib.ExitStack() as stack:
        for trainer in engine.trainer.trainers.values():
            stack.enter_context(trainer.no_sync())
        results = engine.runner.map(on_device)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    engine.trainer._first._broadcast_buffers()
    losses = [(v, n) for v, n in (r for r in results if r is not None) if v is not None]
    device = engine.devices[0]
    loss = torch.zeros((), dtype=torch.float64, device=device)
    for value, n in losses:
        loss = loss + value.detach().double().to(device) * n
    count = sum(n for _, n in losses)
    if step.skipped:
        loss = torch.full_like(loss, math.nan)
    return StepResult(loss, count, not step.skipped)


def _loss_of(out: Any) -> Optional[torch.Tensor]:
    """The loss ``training_step`` returned (a number, or a dict's ``loss``), or None."""
    if isinstance(out, dict):
        out = out.get("loss")
    return out.reshape(()) if isinstance(out, torch.Tensor) and out.numel() == 1 else None
