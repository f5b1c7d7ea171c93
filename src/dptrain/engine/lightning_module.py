"""A ``LightningModule`` handed to ``fit`` as it is: its ``training_step`` is the step and its
``configure_optimizers()`` the optimizer, as Lightning's ``Trainer`` takes them.

    dptrain.fit(lit_model, train, val, epochs=10)       # trainer.fit(lit_model, train_loader, val_loader)

``lightning_adopt.adopt`` takes what ``fit`` was not given: a model with ``training_step`` and no ``step``,
``loss`` or ``forward`` trains on ``model.training_step(batch, batch_idx)`` (its loss, or a
dict holding it: a mean over each device's part, as DDP takes it), and is evaluated by its
``validation_step``: what that gives ``self.log`` is kept as the evaluation's figures
(``val_acc`` is ``test_acc``: ``lightning_log.py``; a torchmetrics object it logs, held by the
module, over the whole set: each device's copy merged), and the test loss is the loss it returns,
else the one it logs, else ``training_step``'s under ``torch.no_grad()``. A
``configure_optimizers`` that takes no argument gives the optimizer and its scheduler
(``lightning_config.py`` reads its forms). ``dptrain.evaluate`` takes the step alike
(``lightning_adopt.steps_of``), so its figures are ``fit``'s. What ``training_step`` gives ``self.log`` is
recorded alike, the epoch's ``train_*`` figures (``train_acc``: its mean over the epoch's
batches, as Lightning's ``on_epoch=True``; a metric object over the epoch), beside ours
(``train_loss``; its logged ``train_loss`` is that).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn

from ..core.signatures import takes
from .kept_outputs import KeptOutputs, outputs_kept
from .lightning_clipping import ModuleClipping
from .lightning_eval_batch import EvalBatchHooks, EvalCallbacks
from .lightning_log import PREFIXES, TEST_PREFIXES, TRAIN_PREFIXES, Logged, StepLogs
from .lightning_trainer import TrainerStandIn, explain_trainer
from .lightning_transfer import before_transfer_of, transfer_of
from .lightning_optimizer_step import ModuleStep
from .manual_calls import ManualOptimization


#: Lightning's hooks of an epoch's end, which read what the steps kept (``kept_outputs.py``).
EPOCH_END_HOOKS = ("on_validation_epoch_end", "on_train_epoch_end")


def _is_loss(out: Any) -> bool:
    """Whether ``validation_step`` returned its loss: one number, or a dict with ``loss``."""
    if isinstance(out, Mapping):
        return out.get("loss") is not None
    return isinstance(out, torch.Tensor) and out.numel() == 1


class LightningSteps:
    """``step=``: ``model.training_step(batch, batch_idx)`` while the model trains. Evaluating,
    ``model.validation_step(batch, batch_idx)``, what it gives ``self.log`` recorded
    (``lightning_log.py``; the names its first call logs become figures of the evaluation,
    ``metrics``): the loss it returns, else the one it logs (``val_loss``), else
    ``training_step``'s (a ``validation_step`` that returns and logs nothing is not called
    again). What ``training_step`` logs is recorded alike (``trained``), the training figures'
    (``TrainFigures.add_logged``): its names are found by a call before training, in eval mode
    without gradients (the trial of every run's first batch). ``batch_idx`` is the batch's index
    in its epoch (or evaluation), which the loop and the evaluation set with ``at``."""

    def __init__(self, model: nn.Module, evaluation: str = "validation_step", trial: bool = True):
        self.index, self.batch = 0, None
        self.evaluation, self.trial = evaluation, trial       # (evaluate: test_step, where the module has one)
        self.takes_index = {name: takes(getattr(model, name, None), 2) for name in ("training_step", evaluation)}
        # (None: not yet called; False: none of the module's own, LightningModule's only warns)
        self.validation: Optional[bool] = None if overridden(model, [evaluation]) else False
        # (a validation_step that keeps what on_validation_epoch_end reads: called though it gives nothing)
        self.kept_for_end = bool(overridden(model, [{"validation_step": "on_validation_epoch_end",
                                                     "test_step": "on_test_epoch_end"}.get(evaluation, "")]))
        # (its lists: what the steps keep; dptrain.evaluate's test_step for on_test_epoch_end too)
        self.ends_epoch = bool(overridden(model, EPOCH_END_HOOKS + ("on_test_epoch_end",)))
        self.metrics: Optional[Dict[str, Any]] = None      # the task's, where logged names are added
        self.validated = StepLogs(evaluation, TEST_PREFIXES + PREFIXES if evaluation == "test_step" else PREFIXES)
        self.trained = StepLogs("training_step", TRAIN_PREFIXES)
        self.clock: Optional[TrainerStandIn] = None        # the module's trainer while fit trains it
        self.kept: Optional[KeptOutputs] = None            # its devices' copies' kept outputs (several devices)
        #: Its optimizers' calls, where training_step steps them (automatic_optimization off)
        self.manual: Optional[ManualOptimization] = None
        #: Its own optimizer_step, which makes each update (a warm-up written there), and its own
        #: lr_scheduler_step(scheduler, metric), which steps the schedulers (a timm scheduler's)
        self.optimizer_step: Optional[ModuleStep] = None
        self.lr_scheduler_step: Optional[Callable[[Any, Any], None]] = None
        #: Its own configure_gradient_clipping, which decides each update's clipping
        self.clipping: Optional[ModuleClipping] = None
        #: Its own on_after_batch_transfer, on each device's part once there (lightning_transfer.py)
        self.transfer = transfer_of(model)     # (a data module's instead: lightning_adopt sets it)
        #: Its own on_before_batch_transfer, on this process's batch before it is cut (``loaded``)
        self.before = before_transfer_of(model)
        #: Its own on_validation_batch_start/end (on_test_batch_*), around each device's step
        self.eval_hooks = EvalBatchHooks(model, evaluation)
        #: Lightning callbacks' on_validation_batch_start/end, around each batch (lightning_callbacks sets it)
        self.eval_callbacks: Optional[EvalCallbacks] = None
        self.eval_stage = "validate"        # (evaluate's: "test", Lightning's trainer.test)

    def at(self, index: int, epoch: Optional[int] = None, step: Optional[int] = None, batch: Any = None) -> None:
        """The batch's index in its epoch (or evaluation); training, the epoch (from 0) and the
        updates done, which the module's trainer (``clock``) then says, and this process's batch
        (which the module's ``on_train_batch_start`` and ``on_train_batch_end`` are given; an
        evaluation, every N steps between the two, leaves it)."""
        self.index = index
        if batch is not None:
            self.batch = batch
        if self.clock is not None and epoch is not None:       # (manual optimization: its optimizers' steps)
            self.clock.at(epoch, step if self.manual is None else self.manual.steps_done)

    def loaded(self, batch: Any, stage: str = "train") -> Any:
        """This process's ``batch`` as the module's ``on_before_batch_transfer`` gives it back (as
        it is without one), its trainer saying ``stage``."""
        return batch if self.before is None or batch is None else self.before(batch, self.clock, stage)

    @contextlib.contextmanager
    def sanity_check(self) -> Iterator[None]:
        """The evaluation set's one-sample check before the run: its trainer says
        ``sanity_checking`` (Lightning's, whose check runs the evaluation's hooks too)."""
        if self.clock is None:
            yield
            return
        self.clock.sanity_checking = True
        try:
            yield
        finally:
            self.clock.sanity_checking = False

    def scheduler_step_of(self, hook: Callable[[Any, Any], None]) -> Callable[..., None]:
        """The module's ``lr_scheduler_step`` as the run's schedule calls it: after a batch, its
        trainer's ``global_step`` the updates done (Lightning's, there)."""
        def step(scheduler: Any, metric: Any, updates: Optional[int] = None) -> None:
            if updates is not None and self.clock is not None:
                self.clock.global_step = updates
            hook(scheduler, metric)
        return step

    def _call(self, model: nn.Module, name: str, batch: Any) -> Any:
        # A compiled replica (--compile) is the module's class's method on its wrapper, so that
        # self(x) runs the compiled forward (the wrapper hands the rest to the module).
        module = model._modules.get("_orig_mod", model)
        if self.clock is not None and module.__dict__.get("_trainer", self.clock) is not self.clock:
            module.__dict__["_trainer"] = self.clock        # (a copy for another device: its trainer left out)
        method = getattr(type(module), name).__get__(model)
        try:
            if self.manual is not None and name == "training_step":
                # (with gradients even in a trial or an evaluation: a step may take torch.autograd.grad,
                # a WGAN-GP's penalty; its steps then do nothing)
                with self.manual.installed(model, module), torch.enable_grad():
                    return method(batch, self.index) if self.takes_index[name] else method(batch)
            return method(batch, self.index) if self.takes_index[name] else method(batch)
        except RuntimeError as e:
            explain_trainer(e, name, "read what you need from the run in a callback (run.epoch, run.step) and "
                                     "set it on run.model, which every device's copy then has")
            raise

    def __call__(self, model: nn.Module, batch: Any) -> Any:
        if self.kept is not None:
            self.kept.count(model)
        if self.clock is not None:          # (its trainer's stage: Lightning's trainer.training...)
            self.clock.stage = "train" if model.training else self.eval_stage
        if self.transfer is not None:       # (its on_after_batch_transfer: the part on its device)
            batch = self.transfer(model, batch, self.clock)
        if model.training:
            return self._train(model, batch)
        if self.validation is False:
            return self._evaluated(model, batch)
        self.name_logs(model, batch)
        return self._validate(model, batch)

    def name_logs(self, model: nn.Module, batch: Any) -> None:
        """The trial before training (the model in eval mode): what ``training_step`` logs,
        called once without gradients (the metric objects it updates are reset each epoch)."""
        if self.trained.names is None and self.trial:
            with torch.no_grad():
                self._train(model, batch)

    def _evaluated(self, model: nn.Module, batch: Any) -> Any:
        """``training_step`` for an evaluation's loss: the metric objects it updates (training's,
        over the epoch) and the lists it appends to left as they were."""
        with outputs_kept(model, self.ends_epoch):
            return self._train(model, batch)

    def train_step(self, model: nn.Module, batch: Any) -> Any:
        """A manual-optimization step on one device: what ``training_step`` returns (None too)."""
        if self.kept is not None:
            self.kept.count(model)
        if self.clock is not None:
            self.clock.stage = "train"
        if self.transfer is not None:
            batch = self.transfer(model, batch, self.clock)
        return self._train(model, batch, as_returned=True)

    def _train(self, model: nn.Module, batch: Any, as_returned: bool = False) -> Any:
        with self.trained.recording(model, batch) as logged:
            out = self._call(model, "training_step", batch)
        self.trained.keep(model, logged)
        if as_returned:
            return out
        if out is None and self.manual is not None:     # (a trial, an evaluation's loss: no figure)
            return torch.full((), math.nan)
        if out is None:
            raise ValueError("model.training_step returned None: return the loss (or a dict with 'loss'); a step "
                             "returning None skips the batch in Lightning, which dptrain does not do (on_nan='skip' "
                             "skips a batch whose loss is not finite)")
        return out

    def _validate(self, model: nn.Module, batch: Any) -> Any:
        with self.validated.recording(model, batch) as logged:     # (what its batch hooks log: the step's)
            out = self._call(model, self.evaluation, batch) if not self.eval_hooks else \
                self.eval_hooks.around(model, batch, self.index, lambda: self._call(model, self.evaluation, batch))
        if self.eval_callbacks is not None:         # (this part's, for the callbacks' on_validation_batch_end)
            self.eval_callbacks.returned[id(model)] = out
        if not _is_loss(out):       # (what else it returns, predictions, Lightning 1's {"val_loss": ...}: not used)
            out = None
        figures = logged.figures
        if self.validation is None:                 # (the first call: its names become figures)
            self.validation = out is not None or bool(figures) or bool(logged.objects) or self.kept_for_end
            self.validated.keep(model, logged)
            if self.metrics is not None:
                for name in self.validated.names or ():
                    if name not in self.metrics:
                        self.metrics[name] = Logged(name, self.validated.latest)
        else:
            self.validated.keep(model, logged)
        if out is None:
            loss = figures.get("loss")
            out = loss[0].reshape(()) if loss is not None else self._evaluated(model, batch)    # (its mean)
        if isinstance(out, Mapping) and (out.get("logits") is not None or out.get("output") is not None):
            return out          # (its logits for metrics=; the logged figures are read from its latest)
        return {**out, "output": figures} if isinstance(out, Mapping) else {"loss": out, "output": figures}


def _theirs(cls: type) -> bool:
    """A class of Lightning's (``LightningModule`` and its bases) or of torch's, not the user's."""
    return cls.__module__.startswith(("lightning.", "pytorch_lightning.", "lightning_fabric.", "torch."))


def overridden(model: nn.Module, hooks: Sequence[str]) -> List[str]:
    """The ``hooks`` the model's own classes define (not Lightning's ``LightningModule``)."""
    found = []
    for hook in hooks:
        owner = next((c for c in type(model).__mro__ if hook in vars(c)), None)
        if owner is not None and not _theirs(owner):
            found.append(hook)
    return found
