"""The callback protocol: hooks into a run, for the user's code and dptrain's own outputs.

The progress bar, the epoch lines, the metrics file, TensorBoard and the trace are callbacks
in the same list as a user's (``fit(..., callbacks=[...])``, or a recipe's
``Task(callbacks=[...])``); whatever they need, a user's callback can have too.

Every process calls every callback at the same points, with the same epoch rows (they are
summed over processes), so a callback that decides from them decides alike everywhere; one
that prints checks ``run.is_main``. ``run.stop(reason)`` ends the run in step on every
process: asked during an epoch, after the batch where all processes have heard it (the
next one with several processes: the request rides with its gradients), and that epoch is
evaluated and saved; asked at an epoch's end, after that epoch. ``state_dict`` and
``load_state_dict`` put a callback's state in checkpoints, so it survives a resume.

    class LogLearningRate(dptrain.Callback):
        def on_batch_end(self, run, batch):
            if batch.step % 50 == 0:
                run.log(f"step {batch.step}: lr {run.optimizer.param_groups[0]['lr']:.4g}")

(``training.py`` has early stopping, the best weights and an EMA written on this protocol.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..engine.step_plan import StepResult
from .hook_names import HOOK_ARGS, check_hooks

Row = Dict[str, Any]


@dataclass
class BatchEnd:
    """One training batch, as ``on_batch_end`` sees it.

    ``epoch`` and ``batch`` count from 1 (``batch`` within the epoch, of ``batches``: None
    for a stream without ``__len__``, read to its end); ``step`` counts the run's batches from
    1; ``samples``: the global batch's samples (every process's); ``result``: this process's
    ``StepResult`` (loss sum, denominator, stepped).
    """
    epoch: int
    batch: int
    batches: Optional[int]
    step: int
    samples: int
    result: StepResult
    _tally: Any

    @property
    def loss(self) -> float:
        """This process's mean loss on the batch (NaN if the step was skipped); waits for the device."""
        total, count = self.result.numbers()
        return total / count if count else math.nan

    @property
    def epoch_loss(self) -> float:
        """This process's mean loss over the epoch so far (when read); waits for the device."""
        total, count = self._tally.numbers()
        return total / count if count else math.nan


class Callback:
    """Hooks into a run; override the ones you need (each is a no-op here).

    ``run`` gives: ``rank``, ``world_size``, ``is_main`` (rank 0), ``epoch``, ``epochs``,
    ``step`` (batches done in the run), ``model`` (the module being trained), ``optimizer``
    (its ``param_groups`` hold the learning rates), ``scheduler``, ``history`` (the epoch
    rows so far), ``devices``, ``log(line)`` (rank 0 prints), ``stop(reason)``,
    ``load_weights(state_dict)`` and ``evaluated_weights()`` (``run/view.py``).
    """

    def on_fit_start(self, run: Any) -> None:
        """Before the first batch (after a resume: before the first batch left to do)."""

    def on_epoch_start(self, run: Any, epoch: int) -> None:
        """Before an epoch's first batch."""

    def on_batch_start(self, run: Any, epoch: int, batch: int) -> None:
        """Before every training step (``run.step`` is the number of steps done before it)."""

    def on_gradients(self, run: Any, batch: BatchEnd, grads: Dict[str, torch.Tensor]) -> None:
        """After every update, before ``on_batch_end``: ``grads`` is ``{name: gradient}`` for each
        parameter it updated, in the model's order, on the model's device: the gradient summed
        over every device and process and divided as the loss's mean is, before clipping (what
        ``p.grad`` holds before ``clip_grad_norm_`` and ``optimizer.step()`` in a plain loop on
        the whole batch; Lightning's ``on_before_optimizer_step`` reads it). A copy is kept for
        it each update, only in a run whose callbacks define this hook. Read-only: the update
        is made (writing to one is an error naming ``p.register_hook`` and ``clip_grad_norm=``)."""

    def on_batch_end(self, run: Any, batch: BatchEnd) -> None:
        """After every training step."""

    def on_train_log(self, run: Any, row: Row) -> None:
        """Every ``log_every_n_steps`` updates: ``row`` has ``step``, ``epoch``, ``batch``,
        ``steps`` (the updates it covers), ``train_loss`` over them (every process) and ``lr``."""

    def on_evaluate_start(self, run: Any, epoch: int) -> None:
        """Before an epoch's evaluation (only with an evaluation set)."""

    def on_evaluate_end(self, run: Any, epoch: int, metrics: Dict[str, float]) -> None:
        """After an epoch's evaluation: ``metrics`` are the ``test_*`` figures over every process."""

    def on_epoch_end(self, run: Any, epoch: int, row: Row) -> None:
        """After an epoch: ``row`` is its history row (train loss, seconds, test figures); a
        figure added to it is seen by the later callbacks and the scheduler, stepped after."""

    def on_checkpoint(self, run: Any, path: str) -> None:
        """After a checkpoint was written to ``path`` (every process is told)."""

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        """After the last epoch (or a stop), with the run's result."""

    def on_exception(self, run: Any, error: BaseException) -> None:
        """When the run ends with an error (a NaN loss, Ctrl-C, a failure): tidy up."""

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps of this callback (default: nothing)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take back what ``state_dict`` gave, when a run resumes."""


HOOKS = tuple(HOOK_ARGS)
#: torch's learning-rate schedulers: given as callbacks (Keras's habit), they are refused with the fix.
SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class CallbackList:
    """Calls every callback's hook in order; each hook is called only on the callbacks that
    define it (a run of 10,000 batches with no ``on_batch_end`` makes no call for it)."""

    def __init__(self, callbacks: Sequence[Any] = ()):
        self.callbacks: List[Any] = list(callbacks)
        for cb in self.callbacks:
            if isinstance(cb, SCHEDULERS):
                raise TypeError(f"callbacks holds a {type(cb).__name__}, a learning-rate scheduler (Keras's "
                                f"ReduceLROnPlateau is a callback): pass it as scheduler= (made on the optimizer "
                                f"given to fit, or scheduler=lambda optimizer: ...), with scheduler_monitor='val_loss' "
                                f"for a plateau's figure")
            check_hooks(cb, overrides)      # (first: a peer's callback, with none of our hooks, is named so)
            if not any(callable(getattr(cb, h, None)) for h in HOOKS):
                raise TypeError(f"callbacks must have at least one of the hooks {', '.join(HOOKS)} (subclass "
                                f"dptrain.Callback); got {type(cb).__name__}")
        self._bound = {h: [getattr(cb, h) for cb in self.callbacks if overrides(cb, h)] for h in HOOKS}
        for hook, bound in self._bound.items():     # callers made once: a step makes no closure
            setattr(self, hook, _caller(bound))

    def wants(self, hook: str) -> bool:
        return bool(self._bound[hook])

    def keys(self) -> List[str]:
        """Each callback's name in checkpoints: its class, numbered if the class comes twice."""
        names = [getattr(cb, "state_key", None) or type(cb).__qualname__ for cb in self.callbacks]
        return [n if names.count(n) == 1 else f"{n}#{names[:i].count(n) + 1}" for i, n in enumerate(names)]

    def state_dict(self) -> Dict[str, Dict[str, Any]]:
        out = {}
        for key, cb in zip(self.keys(), self.callbacks):
            state = cb.state_dict() if callable(getattr(cb, "state_dict", None)) else {}
            if state:
                out[key] = state
        return out

    def load_state_dict(self, states: Optional[Dict[str, Dict[str, Any]]]) -> List[str]:
        """Give each callback its saved state; return the names of those the checkpoint had
        none for (they start afresh)."""
        states = states or {}
        fresh = []
        for key, cb in zip(self.keys(), self.callbacks):
            if key in states and callable(getattr(cb, "load_state_dict", None)):
                cb.load_state_dict(states[key])
            elif callable(getattr(cb, "state_dict", None)) and cb.state_dict():
                fresh.append(key)
        return fresh


def _caller(bound: List[Any]):
    def call(*args: Any) -> None:
        for fn in bound:
            fn(*args)
    return call


def overrides(cb: Any, hook: str) -> bool:
    """Whether ``cb`` does something at ``hook`` (not the base class's no-op)."""
    if callable(getattr(cb, "__dict__", {}).get(hook)):     # set on the instance
        return True
    fn = getattr(type(cb), hook, None)
    if fn is None:
        return callable(getattr(cb, hook, None))
    return fn is not getattr(Callback, hook, None)
