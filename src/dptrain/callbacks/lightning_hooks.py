"""A ``LightningModule``'s own hooks of the run's course, called by ``fit`` where Lightning's
``Trainer`` calls them: ``on_fit_start`` and ``on_train_start`` as the run starts,
``on_train_epoch_start`` before each epoch's first batch, ``on_validation_start`` and
``on_validation_epoch_start`` before its evaluation, ``on_validation_epoch_end`` and
``on_validation_end`` (an evaluated epoch) and ``on_train_epoch_end`` at its end,
``on_train_end`` and ``on_fit_end`` as the run ends (also when it stops early). The
caller goes first among the callbacks, so that what an epoch-end hook logs is in the row the
others see (``EarlyStopping("val_f1")``).

    class FineTune(L.LightningModule):
        def on_train_epoch_start(self):
            if self.current_epoch == 2:            # the backbone trains from the third epoch
                self.backbone.requires_grad_(True)

        def on_validation_epoch_end(self):         # over what validation_step kept
            self.log("val_auc", auroc(torch.cat(self.scores), torch.cat(self.labels)))
            self.scores.clear(); self.labels.clear()

Each is called once in a process, on the module (the first device's replica); what it changes
there is given to the other devices' copies as a callback's edits are (``ModelEdits``: a layer
unfrozen trains on every device). Its ``self.current_epoch`` and ``self.global_step`` are
Lightning's at that point. What an epoch-end hook ``self.log``s joins the epoch's row (``val_``
names as ``test_``, the others as ``train_``; several processes: the mean of theirs, each over
its own part, as Lightning's DDP with ``sync_dist=True``). Those hooks read what the steps kept,
which each device's copy keeps apart: on several devices of a process it is put together in the
module first (``engine/kept_outputs.py``), so they see what one device's module would hold.
Before each, the module's trainer (a stand-in) has in ``callback_metrics`` what the steps logged
that it may read, by the logged names: the evaluation's figures before ``on_validation_epoch_end``,
the training's before ``on_train_epoch_end`` (as Lightning's ``Trainer``), then what it logged.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..engine.kept_outputs import KeptOutputs
from ..engine.lightning_log import PREFIXES, TRAIN_PREFIXES, hook_logged, processes_mean
from ..engine.lightning_logger import BoardLogger
from ..engine.lightning_adopt import BATCH_HOOKS, COURSE_HOOKS
from ..engine.lightning_eval_batch import EvalCallbacks
from ..engine.lightning_module import EPOCH_END_HOOKS, LightningSteps
from ..parallel.given_model import unwrapped
from .base import Callback
from .lightning_batch_hooks import ModuleBatchHooks
from .lightning_callbacks import EVAL_BATCH_HOOKS, HookTargets, lightning_callbacks
from .lightning_checkpoint_hooks import CHECKPOINT_HOOKS, ModuleCheckpointHooks
from .outputs import TensorBoard


#: The module's hooks called, by the callback event that calls them (in Lightning's order).
CALLED = {"on_fit_start": ("on_fit_start", "on_train_start"), "on_epoch_start": ("on_train_epoch_start",),
          "on_evaluate_start": ("on_validation_start", "on_validation_epoch_start"),
          "on_epoch_end": ("on_validation_epoch_end", "on_validation_end", "on_train_epoch_end"),
          "step_evaluation": ("on_validation_epoch_end", "on_validation_end"),
          "on_fit_end": ("on_train_end", "on_fit_end")}
#: The hooks around an evaluation, which an evaluation every N steps calls too.
VALIDATION_HOOKS = ("on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_end")
#: How a name each epoch-end hook logs begins (``val_f1`` in on_validation_epoch_end: ``test_f1``).
ROW_NAMES = {"on_validation_epoch_end": ("test_", PREFIXES), "on_train_epoch_end": ("train_", TRAIN_PREFIXES)}
#: Whose logged figures each epoch-end hook reads in ``callback_metrics`` (``LightningSteps``' step logs).
READS = {"on_validation_epoch_end": "validated", "on_train_epoch_end": "trained"}


def with_module_hooks(model: nn.Module, what: Dict[str, Any]) -> List[str]:
    """Put first in ``what``'s callbacks (``fit``'s keywords) the caller of the hooks of the
    run's course the model overrides, when it was taken as a LightningModule (its step is ours;
    with its trainer a stand-in, whatever it overrides: the caller fills ``callback_metrics``):
    first, so that what its epoch-end hooks log is in the row the other callbacks see; then the
    caller of its batch hooks, if it or they override them (``ModuleBatchHooks``), and of its
    checkpoint hooks (``ModuleCheckpointHooks``). Lightning callbacks of one's own among the
    callbacks are called by those (``lightning_callbacks.py``): returns the lines saying so."""
    steps = what.get("step")
    model = unwrapped(model)
    if not isinstance(steps, LightningSteps):
        return []
    theirs, notes = lightning_callbacks(what)
    targets = HookTargets(model, theirs, steps.clock if steps.clock is not None else vars(model).get("_trainer"))
    # Their setup(stage="fit") now, before the run calls configure_optimizers and copies the model to
    # its devices, as Lightning's Trainer calls it (the module's own: lightning_data.py): what it freezes
    # (a BaseFinetuning's backbone) is left out of the optimizer and trains on no device.
    targets.of_callbacks("setup", "fit")
    hooks, batch_hooks = targets.overriding(COURSE_HOOKS), targets.overriding(BATCH_HOOKS)
    evaluated = [h for h in EVAL_BATCH_HOOKS if any(h in own for own in targets.own)]    # (the callbacks' alone)
    if evaluated:
        steps.eval_callbacks = EvalCallbacks(targets.of_callbacks, evaluated, steps.clock)
    kept = targets.overriding(CHECKPOINT_HOOKS + ("state_dict", "load_state_dict"))
    if hooks or batch_hooks or kept or theirs or steps.clock is not None:   # (the stand-in's callback_metrics)
        listed: List[Any] = list(what.get("callbacks") or [])      # (fit's: a list)
        what["callbacks"] = [ModuleHooks(model, hooks, steps, targets)] + \
            ([ModuleBatchHooks(model, batch_hooks, steps, targets)] if batch_hooks else []) + \
            ([ModuleCheckpointHooks(model, targets)] if kept else []) + listed     # (apart: see there)
    return notes


class ModuleHooks(Callback):
    """Calls ``hooks`` (those of ``COURSE_HOOKS`` the module overrides) of ``module`` at their
    points; ``steps``: its ``LightningSteps``, whose ``clock`` (the module's stand-in trainer;
    None: it has its own) is set to the epoch first. What an epoch-end hook logs joins the
    epoch's row (over the processes, the mean); on several devices, what the steps kept is put
    together first (``KeptOutputs``). The stand-in's ``callback_metrics`` is filled as they are
    called (``_metrics``), whether the module overrides them or not."""

    def __init__(self, module: nn.Module, hooks: Sequence[str], steps: LightningSteps,
                 targets: Optional[HookTargets] = None):
        self.module, self.hooks, self.steps, self.clock = module, tuple(hooks), steps, steps.clock
        self.targets = targets if targets is not None else HookTargets(module, (), steps.clock)
        self.ends = any(hook in self.hooks for hook in EPOCH_END_HOOKS)
        self.hook_names: Dict[str, str] = {}    # the row's names of what the epoch-end hooks logged, by logged name

    def _call(self, event: str, run: Any, epochs_done: int, row: Optional[Dict[str, Any]] = None) -> Dict[str, float]:
        if self.clock is not None:
            self.clock.at(epochs_done, run.step)
        logged: Dict[str, float] = {}
        for hook in CALLED[event]:
            if row is not None and hook in ROW_NAMES:       # what the hook reads in callback_metrics, first
                logs = getattr(self.steps, READS[hook]).logged_as()
                self._metrics(row, {name: ROW_NAMES[hook][0] + figure for name, figure in logs.items()})
            if hook not in self.hooks or (event == "on_epoch_end" and hook in VALIDATION_HOOKS
                                          and not run.evaluated_epoch):
                continue
            if hook not in ROW_NAMES:
                self.targets.call(hook)
                continue
            start, prefixes = ROW_NAMES[hook]
            recording = hook_logged(self.module, hook, prefixes,       # (a callback's pl_module.log too)
                                    lambda: self.targets.call(hook))
            logged.update({start + name: float(value) for name, (value, _) in recording.figures.items()})
            self.hook_names.update({name: start + figure for name, figure in recording.names.items()})
            self._metrics(logged, self.hook_names)
        return logged

    def _metrics(self, figures: Dict[str, Any], names: Dict[str, str]) -> None:
        """Put in the stand-in's ``callback_metrics`` each of ``figures`` that ``names`` (the
        module's logged names, by figure) names, as Lightning's: a tensor, by the logged name."""
        if self.clock is not None:
            self.clock.callback_metrics.update({name: torch.tensor(float(figures[key])) for name, key in names.items()
                                                if key in figures})

    def on_fit_start(self, run: Any) -> None:
        if self.clock is not None:      # (self.trainer.should_stop = True: the run stops)
            self.clock.lend_stop(lambda: run.stop("the model set self.trainer.should_stop"))
        board = next((cb for cb in run.callbacks.callbacks if isinstance(cb, TensorBoard)), None)
        if board is not None and self.clock is not None:        # (self.logger.experiment: its writer)
            self.clock.lend_logger(BoardLogger(board.board.writer if board.board is not None else None,
                                               board.directory))
        if self.ends and len(run.devices) > 1:
            self.steps.kept = KeptOutputs(run.engine.replicas, run.devices[0])
        if run.config.eval_every_n_steps and any(hook in self.hooks for hook in VALIDATION_HOOKS):
            run.step_evaluation_hooks.append(self)
            run.reuse_step_evaluation = False       # (the epoch's evaluation runs its validation_step again)
        self._call("on_fit_start", run, run.epoch - 1)

    def before_step_evaluation(self, run: Any) -> None:
        """An evaluation every N steps starts (Lightning's validation every ``val_check_interval``)."""
        self.on_evaluate_start(run, run.epoch)

    def after_step_evaluation(self, run: Any, figures: Dict[str, Any]) -> None:
        """... and ended, its ``figures`` (``test_*``) made: its ``on_validation_epoch_end`` over what
        its validation_step kept (gathered first; the training's items kept so far too), what it
        logs in ``figures``."""
        if self.steps.kept is not None:
            self._gather()
        figures.update(self._over_processes(run, self._call("step_evaluation", run, run.epoch - 1, figures)))
        if self.steps.kept is not None:     # (after the hook, as at an epoch's start: a list it clears is empty)
            self.steps.kept.start()         # (the training's items after it: a new part)

    def on_epoch_start(self, run: Any, epoch: int) -> None:
        self._call("on_epoch_start", run, epoch - 1)
        if self.steps.kept is not None:         # (after the hook: a list it clears is marked empty)
            self.steps.kept.start()

    def on_evaluate_start(self, run: Any, epoch: int) -> None:
        self._call("on_evaluate_start", run, epoch - 1)
        if self.steps.kept is not None:
            self.steps.kept.evaluating()

    def on_epoch_end(self, run: Any, epoch: int, row: Dict[str, Any]) -> None:
        if self.steps.kept is not None:
            self._gather()
        row.update(self._over_processes(run, self._call("on_epoch_end", run, epoch - 1, row)))

    def _gather(self) -> None:
        self.steps.kept.gather({*self.steps.validated.paths.values(), *self.steps.trained.paths.values()})

    def _over_processes(self, run: Any, logged: Dict[str, float]) -> Dict[str, float]:
        """What the hooks ``logged`` in each process, the mean of the processes' (every row alike)."""
        if run.world_size > 1 and self.ends:
            logged = processes_mean(run.collective, logged)
            self._metrics(logged, self.hook_names)
        return logged

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        self.steps.kept = None
        self._call("on_fit_end", run, run.epoch)         # (Lightning's: the epochs done)
        self.targets.of_callbacks("teardown", "fit")

    def on_exception(self, run: Any, error: BaseException) -> None:
        self.steps.kept = None
        self.targets.of_callbacks("on_exception", error)
        self.targets.of_callbacks("teardown", "fit")
