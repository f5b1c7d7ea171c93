"""What a manual-optimization LightningModule's ``training_step`` calls, set on each device's copy
while it runs (``self.optimizers()``, ``self.manual_backward``, ``self.lr_schedulers()``,
``self.toggle_optimizer``, ``self.clip_gradients``...): see ``manual_optimization.py``.

Each call reads this thread's ``Part`` of the step running (its device, its samples): outside a
training step (the trial before training, an evaluation's loss) there is none, and the calls
that would train do nothing. ``opt.step()`` hands over to the step's exchange.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from .lightning_clipping import asked_clipping

CALLS = ("optimizers", "lr_schedulers", "manual_backward", "toggle_optimizer", "untoggle_optimizer",
         "toggled_optimizer", "clip_gradients")
local = threading.local()      # (its part: the step running on this thread)


class ManualOptimization:
    """What a manual-optimization module's calls reach while ``fit`` trains it: the run's
    ``Trainers`` (one per optimizer, named by their place: "0", "1"...) and schedulers."""

    def __init__(self) -> None:
        self.trainers: Any = None
        self.schedulers: Dict[str, Any] = {}
        self.group: Any = None          # (the step's exchange across the device threads: a ThreadGroup)
        #: The optimizer steps taken in the run, which the module's ``self.global_step`` says
        #: (Lightning's, with manual optimization: every optimizer's steps); ``clock``: its trainer.
        self.steps_done = 0
        self.clock: Any = None

    def stepped(self) -> None:
        """An optimizer stepped (once a process, every device waiting in the exchange)."""
        self.steps_done += 1
        if self.clock is not None:
            self.clock.global_step = self.steps_done

    @contextlib.contextmanager
    def installed(self, model: nn.Module, module: nn.Module) -> Iterator[None]:
        """``model``'s ``self.optimizers()``, ``self.manual_backward`` and the rest (``CALLS``) as
        this run's while the block runs (an instance's attribute comes before its class's method);
        ``module``: the module itself (``model``, or the module a compiled ``model`` wraps)."""
        calls = _Calls(self, module)
        had = {name: model.__dict__[name] for name in CALLS if name in model.__dict__}
        for name in CALLS:
            model.__dict__[name] = getattr(calls, name)
        try:
            yield
        finally:
            for name in list(calls.toggled):        # (a toggle the step left on: undone)
                for p, flag in calls.toggled.pop(name):
                    p.requires_grad_(flag)
            for name in CALLS:
                model.__dict__.pop(name, None)
            model.__dict__.update(had)

    def names(self) -> List[str]:
        return self.trainers.names if self.trainers is not None else []


def _part() -> Optional["Part"]:
    """This thread's part of the training step running (None: a trial, an evaluation)."""
    return getattr(local, "part", None)


class _Calls:
    """The module's calls of its optimizers, for one copy (``module``) during one call."""

    def __init__(self, manual: ManualOptimization, module: nn.Module):
        self.manual, self.module = manual, module
        self.toggled: Dict[str, List[Tuple[torch.Tensor, bool]]] = {}

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        made = [ManualOptimizer(self, name) for name in self.manual.names()]
        return made[0] if len(made) == 1 else made

    def lr_schedulers(self) -> Any:
        made = [ManualScheduler(name, s) for name, s in self.manual.schedulers.items()]
        return None if not made else made[0] if len(made) == 1 else made

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        part = _part()
        if part is None:
            return
        (loss if part.step.alone else loss * part.n).backward(*args, **kwargs)

    def params_of(self, name: str) -> List[torch.Tensor]:
        own = self.manual.trainers._own[name]
        return [p for j, p in enumerate(self.module.parameters()) if j in own]

    def toggle_optimizer(self, optimizer: "ManualOptimizer") -> None:
        """Only ``optimizer``'s parameters require gradients (the others', as Lightning's, off)."""
        name = _name_of(optimizer)
        own = {id(p) for p in self.params_of(name)}
        paused = [(p, p.requires_grad) for p in self.module.parameters() if id(p) not in own]
        for p, _ in paused:
            p.requires_grad_(False)
        self.toggled[name] = paused

    def untoggle_optimizer(self, optimizer: "ManualOptimizer") -> None:
        for p, flag in self.toggled.pop(_name_of(optimizer), []):
            p.requires_grad_(flag)

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: "ManualOptimizer") -> Iterator[None]:
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(self, optimizer: "ManualOptimizer", gradient_clip_val: Optional[float] = None,
                       gradient_clip_algorithm: Optional[str] = None) -> None:
        """Clip at ``optimizer``'s next step, once its gradient is summed over every device."""
        asked = asked_clipping(gradient_clip_val, gradient_clip_algorithm)    # (fit's own clipping is refused)
        part = _part()
        if part is not None and asked[1] > 0:
            part.clip[_name_of(optimizer)] = asked


def _name_of(optimizer: Any) -> str:
    if not isinstance(optimizer, ManualOptimizer):
        raise TypeError(f"give one of self.optimizers(), not a {type(optimizer).__name__}")
    return optimizer.name


class ManualOptimizer:
    """One of ``self.optimizers()`` on one device: ``step`` is the exchange (see the module);
    ``param_groups`` and the rest are the run's optimizer's (its learning rates)."""

    def __init__(self, calls: _Calls, name: str):
        self._calls, self.name = calls, name

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._calls.manual.trainers.trainers[self.name].optimizer

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        result = closure() if closure is not None else None     # (Lightning's: the closure's backward first)
        part = _part()
        if part is not None:
            part.step.exchange(part, self.name)
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        if _part() is None:
            return
        for p in self._calls.params_of(self.name):
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        with self._calls.toggled_optimizer(self):
            yield

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class ManualScheduler:
    """One of ``self.lr_schedulers()`` (of optimizer ``name``): its ``step`` is a round of the
    step's exchanges, the scheduler stepped once a process (a process without a sample too)."""

    def __init__(self, name: str, scheduler: Any):
        self.name, self.scheduler = name, scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        part = _part()
        if part is not None:
            part.step.schedule(part, self.name, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)


class Part:
    """Device ``i``'s part of one step (``step``: its exchanges, ``manual_optimization._Step``):
    its samples ``n``, and the clipping asked for."""

    def __init__(self, step: Any, i: int, n: int):
        self.step, self.i, self.n = step, i, n
        self.clip: Dict[str, Tuple[str, float]] = {}
