"""A LightningModule's own ``optimizer_step``: a warm-up or a schedule written around the update.

Lightning's documented warm-up overrides the hook that makes each update::

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)           # training_step, backward, update
        if self.trainer.global_step < 500:                  # then the next update's rate
            for group in optimizer.param_groups:
                group["lr"] = min(1.0, (self.trainer.global_step + 1) / 500) * self.hparams.lr

``fit`` calls it once a process for each update, on the module itself, where Lightning's
``Trainer`` calls it: ``epoch`` and ``batch_idx`` as Lightning's (from 0; with
``accumulate_grad_batches``, the group's last batch), ``optimizer`` the run's (its
``param_groups`` are the rates every device's optimizer takes at the next update), and
``optimizer.step(closure=optimizer_closure)`` the whole of dptrain's step (every device's forward
and backward, the sum over devices and processes, clipping, the update); the module's
``trainer.global_step`` counts it once the hook returns, as Lightning's does. A hook that leaves the update out, calls it
twice, or calls the closure itself (a batch trained and not stepped) is an error naming the fix:
dptrain's step is the closure and the update in one.
"""
from __future__ import annotations

from typing import Any, Callable

_CLOSURE = ("optimizer_closure is dptrain's step, forward and backward and the update in one: call "
            "optimizer.step(closure=optimizer_closure) once in optimizer_step (to skip updates, use "
            "accumulate_grad_batches=N)")


class _Closure:
    """``optimizer_closure``: only ``optimizer.step`` runs it (see the module docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(_CLOSURE)


class StepOptimizer:
    """The ``optimizer`` the hook gets: the run's, whose ``step(closure=...)`` is ``run_step``."""

    def __init__(self, optimizer: Any, run_step: Callable[[], Any], clock: Any):
        self.optimizer, self._run_step, self._clock = optimizer, run_step, clock
        self.result: Any = None

    @property
    def param_groups(self) -> Any:
        return self.optimizer.param_groups

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        if not isinstance(closure, _Closure):
            raise ValueError(f"optimizer.step() in optimizer_step without the optimizer_closure it was given: "
                             f"{_CLOSURE}")
        if self.result is not None:
            raise ValueError(f"optimizer.step(closure=optimizer_closure) twice in one optimizer_step: {_CLOSURE}")
        self.result = self._run_step()      # (the module's global_step counts it after the hook, as Lightning's)
        return None

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: dptrain's step starts from no gradient."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class ModuleStep:
    """The module's ``optimizer_step``, made into each update (see the module docstring)."""

    def __init__(self, model: Any, clock: Any):
        self.hook, self.clock = model.optimizer_step, clock

    def __call__(self, optimizer: Any, epoch: int, b: int, loader: Any, run_step: Callable[[], Any]) -> Any:
        """Update ``b`` (from 1) of ``epoch`` (from 0), read from ``loader``, by the hook."""
        stepping = StepOptimizer(optimizer, run_step, self.clock)
        self.hook(epoch, last_batch(b, loader), stepping, _Closure())
        if stepping.result is None:
            raise ValueError(f"the module's optimizer_step returned without optimizer.step(closure=optimizer_closure): "
                             f"{_CLOSURE}")
        return stepping.result


def last_batch(b: int, loader: Any) -> int:
    """Lightning's ``batch_idx`` of update ``b``: its group's last batch (``accumulate_grad_batches``:
    the loader groups ``k`` of the batches ``loader.loader`` gives)."""
    k, inner = getattr(loader, "k", 1), getattr(loader, "loader", None)
    return min(b * k, len(inner)) - 1 if inner is not None and hasattr(inner, "__len__") else b * k - 1

