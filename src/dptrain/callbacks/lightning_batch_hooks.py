"""A ``LightningModule``'s own hooks of each training batch, called by ``fit`` where Lightning's
``Trainer`` calls them: ``on_train_batch_start(batch, batch_idx)`` before the batch trains,
``on_before_zero_grad(optimizer)`` before its step (Lightning's is after the batch's forward,
before its backward: the same weights), ``on_after_backward()`` and
``on_before_optimizer_step(optimizer)`` with each parameter's ``p.grad`` the update's whole
gradient before clipping (given after the update, as ``Callback.on_gradients`` is: the
gradients summed over every device and process and divided, on the module; read-only), and
``on_train_batch_end(outputs, batch, batch_idx)`` after the update (a momentum encoder's habit:
BYOL's and MoCo's target network follows the online one after each update).

    class BYOL(L.LightningModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            with torch.no_grad():
                for t, o in zip(self.target.parameters(), self.online.parameters()):
                    t.mul_(0.99).add_(o, alpha=0.01)

        def on_before_optimizer_step(self, optimizer):      # Lightning's documented place
            self.log_dict(grad_norm(self, norm_type=2))     # each step row (log_every_n_steps)

Each is called once in a process, on the module (the first device's replica), as Lightning's
DDP calls it once a process: ``batch`` is this process's batch as its loader gives it (every
device's part of it), ``batch_idx`` its index in the epoch, ``self.global_step`` the updates done
before it, or with it at its end; ``outputs`` is ``{"loss": the batch's mean loss}`` (this
process's: each device's ``training_step`` gives its own outputs, so only the loss is put
together). What a hook logs goes where Lightning's goes (``lightning_batch_logs.py``: the step
rows; with ``on_epoch=True`` the epoch's mean). What a hook changes (weights written in place,
attributes) is given to every device's copy before the next step: the run watches its batches
for edits, as for a callback's ``on_batch_end``. A callback of its own, apart from
``ModuleHooks``: only a module overriding them pays for that watch (and for the gradients' copy
only one overriding ``on_after_backward`` or ``on_before_optimizer_step``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..engine.lightning_adopt import GRADIENT_HOOKS
from ..engine.lightning_module import LightningSteps
from .base import BatchEnd, Callback
from .lightning_batch_logs import BatchLogs

#: The hooks Lightning calls on every micro-batch, which fit's accumulation steps at once.
MICRO_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_zero_grad", "on_after_backward")


class ModuleBatchHooks(Callback):
    """Calls ``hooks`` (those of ``BATCH_HOOKS`` the module overrides) of ``module`` around each
    training batch; ``steps``: its ``LightningSteps``, which holds the batch (``at``) and the
    module's stand-in trainer (``clock``). Only the callback events of the hooks overridden are
    set (on the instance): a run calls an event, and watches for edits after it, only where set."""

    def __init__(self, module: nn.Module, hooks: Sequence[str], steps: LightningSteps, targets: Any = None):
        self.module, self.hooks, self.steps = module, tuple(hooks), steps
        # (a HookTargets: Lightning callbacks' hooks first; None, or no callback: the module's alone, called directly)
        self.targets = targets if targets is not None and targets.callbacks else None
        self.logs = BatchLogs(module)
        self.ended = -1         # the update whose on_train_batch_end ran (early, for its step row)
        self.optimizer: Any = None
        self.rows = False
        self._named: Optional[List[Tuple[nn.Parameter, str]]] = None
        if "on_train_batch_start" in self.hooks or "on_before_zero_grad" in self.hooks:
            self.on_batch_start = self._batch_start
        if any(hook in self.hooks for hook in GRADIENT_HOOKS):
            self.on_gradients = self._gradients
        if "on_train_batch_end" in self.hooks:
            self.on_batch_end = self._batch_end

    def on_fit_start(self, run: Any) -> None:
        self.optimizer, self.rows = run.optimizer, bool(run.config.log_every_n_steps)
        micro = [hook for hook in self.hooks if hook in MICRO_BATCH_HOOKS]
        if micro and run.config.accumulate_grad_batches > 1:
            raise ValueError(f"the module's {' and '.join(micro)} with accumulate_grad_batches="
                             f"{run.config.accumulate_grad_batches}: Lightning calls them on every micro-batch, fit "
                             f"steps a group of them at once; give their work to a dptrain.Callback's "
                             f"on_batch_start or on_batch_end (once an update; run.model is the module)")

    def _call(self, run: Any, hook: str, step: int, *args: Any) -> Any:
        out = self.logs.call(hook, step, *args, fn=None if self.targets is None else
                             (lambda *given: self.targets.call(hook, *given)))
        if not self.rows and run.is_main:
            self.logs.tell_unrowed(run.log, self.hooks)
        return out

    def _batch_start(self, run: Any, epoch: int, batch: int) -> None:
        if "on_train_batch_start" in self.hooks and \
                self._call(run, "on_train_batch_start", run.step + 1, self.steps.batch, batch - 1) == -1:
            raise ValueError("the module's on_train_batch_start returned -1 (Lightning: skip the epoch's other "
                             "batches), which fit does not do: give fit max_batches=N to cut every epoch, or set "
                             "self.trainer.should_stop = True to end the run")
        if "on_before_zero_grad" in self.hooks:
            if self.steps.clock is not None:
                self.steps.clock.at(epoch - 1, run.step)
            self._call(run, "on_before_zero_grad", run.step + 1, self.optimizer)

    def _gradients(self, run: Any, batch: BatchEnd, grads: Dict[str, torch.Tensor]) -> None:
        if self.steps.clock is not None:
            self.steps.clock.at(batch.epoch - 1, batch.step - 1)        # (Lightning's: before the update)
        if self._named is None:         # (the module's parameters by the run's names: the same all run)
            names = {id(p): name for name, p in run.model.named_parameters()}
            self._named = [(p, names[id(p)]) for p in self.module.parameters() if id(p) in names]
        params = [p for p, _ in self._named]
        had = [p.grad for p in params]
        versions = {name: g._version for name, g in grads.items()}
        try:
            for p, name in self._named:
                p.grad = grads.get(name)
            for hook in GRADIENT_HOOKS:
                if hook in self.hooks:
                    self._call(run, hook, batch.step, *((self.optimizer,) if hook == "on_before_optimizer_step" else ()))
        finally:
            for p, grad in zip(params, had):
                p.grad = grad
        changed = [name for name, g in grads.items() if g._version != versions[name]]
        if changed:
            raise ValueError(f"the module's {' or '.join(h for h in GRADIENT_HOOKS if h in self.hooks)} wrote to "
                             f"the gradient of {', '.join(map(repr, changed[:3]))}: fit gives these hooks each "
                             f"update's gradients after the update, which that cannot change; change a gradient "
                             f"with a hook on its parameter (p.register_hook(lambda g: ...), every device's copy "
                             f"runs it), or clip with fit's clip_grad_norm= or clip_grad_value=")

    def on_train_log(self, run: Any, row: Dict[str, Any]) -> None:
        if "on_train_batch_end" in self.hooks and row["step"] == run.step and self.ended != run.step \
                and run.batch_end is not None and run.batch_end.step == run.step:
            self._batch_end(run, run.batch_end)     # (Lightning logs the step after it: its figures in the row)
        self.logs.into_step_row(row)

    def _batch_end(self, run: Any, batch: BatchEnd) -> None:
        if self.ended == batch.step:
            return
        self.ended = batch.step
        if self.steps.clock is not None:
            self.steps.clock.at(batch.epoch - 1, batch.step)        # (Lightning's: the update done)
        self._call(run, "on_train_batch_end", batch.step, BatchOutputs(batch), self.steps.batch, batch.batch - 1)

    def on_epoch_end(self, run: Any, epoch: int, row: Dict[str, Any]) -> None:
        self.logs.into_epoch_row(row)

    def state_dict(self) -> Dict[str, Any]:
        return self.logs.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.logs.load_state_dict(state)


class BatchOutputs(Mapping):
    """``on_train_batch_end``'s ``outputs``: ``{"loss": ...}``, the batch's mean loss over this
    process's devices (a tensor, computed when read); another key is a ``KeyError`` saying why."""

    def __init__(self, batch: BatchEnd):
        self._batch = batch

    def __getitem__(self, key: str) -> torch.Tensor:
        if key != "loss":
            raise KeyError(f"outputs[{key!r}]: in on_train_batch_end, dptrain's outputs hold the batch's loss alone "
                           f"(each device's training_step gives its own outputs): keep what the hook needs on self "
                           f"in training_step")
        return torch.tensor(self._batch.loss)

    def __iter__(self) -> Iterator[str]:
        return iter(("loss",))

    def __len__(self) -> int:
        return 1
