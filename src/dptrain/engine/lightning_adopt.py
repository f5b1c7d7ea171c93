"""What ``fit`` takes of a ``LightningModule`` (``lightning_module.py``'s ``LightningSteps``), and
what it refuses: its steps, its ``configure_optimizers``, its own ``optimizer_step`` and
``lr_scheduler_step`` and ``configure_gradient_clipping`` (``lightning_clipping.py``), its
``configure_callbacks``, manual optimization; its own ``backward`` is an error naming ours, and
the other hooks it overrides are named in a line (the run's course and batch hooks are called:
``callbacks/lightning_hooks.py``; ``on_after_batch_transfer``: ``lightning_transfer.py``).

    notes = adopt(model, what, stand_in)     # what: fit's task keywords, filled from the module's methods
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional

from torch import nn

from ..core.signatures import takes
from ..parallel.given_model import unwrapped
from .lightning_clipping import ModuleClipping
from .lightning_eval_batch import AROUND
from .lightning_test_hooks import test_hook_names
from .lightning_module import EPOCH_END_HOOKS, LightningSteps, overridden
from .lightning_optimizer_step import ModuleStep
from .lightning_trainer import LateConfigure, TrainerStandIn, attach, detach
from .lightning_transfer import before_transfer_of, transfer_of
from .manual_calls import ManualOptimization

#: Lightning's hooks that decide how a step trains: a module overriding one is refused (dptrain's
#: step would leave it out; its own ``optimizer_step`` is taken: ``lightning_optimizer_step.py``, its
#: ``lr_scheduler_step``, by the run's schedule: ``run/schedule.py``, and its
#: ``configure_gradient_clipping``: ``lightning_clipping.py``).
STEP_HOOKS = ("backward",)
#: Lightning's hooks of the run's course that fit calls (``callbacks/lightning_hooks.py``).
COURSE_HOOKS = ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_validation_start",
                "on_validation_epoch_start", *EPOCH_END_HOOKS, "on_validation_end", "on_train_end", "on_fit_end")
#: ... with each update's gradients in ``p.grad`` (given after the update: ``Callback.on_gradients``).
GRADIENT_HOOKS = ("on_after_backward", "on_before_optimizer_step")
#: ... and around each training batch (``callbacks/lightning_batch_hooks.py``).
BATCH_HOOKS = ("on_train_batch_start", "on_before_zero_grad", *GRADIENT_HOOKS, "on_train_batch_end")
#: Lightning's other hooks of a module, which dptrain does not call (a line names those overridden).
OTHER_HOOKS = ("on_validation_model_eval", "on_validation_model_train", "transfer_batch_to_device",
               "optimizer_zero_grad", "on_before_backward")


def _check_hooks(model: nn.Module, notes: List[str]) -> None:
    """Refuse a module whose hooks change how a step trains; name the other hooks not called."""
    steering = overridden(model, STEP_HOOKS)
    if steering:
        raise ValueError(f"the module overrides {', '.join(steering)}, Lightning's hooks deciding how a step "
                         f"trains, which fit does not call: give fit step=fn(model, batch) -> loss (its backward is "
                         f"fit's, on every device), or remove them")
    others = overridden(model, OTHER_HOOKS)
    if others:
        notes.append(f"the module's {', '.join(others)} (Lightning hooks) are not called: give their work to a "
                     f"dptrain.Callback (on_fit_start, on_epoch_end, on_evaluate_end...; run.model is the module; "
                     f"reading a gradient, to on_gradients; changing one, to p.register_hook)")
    called = overridden(model, COURSE_HOOKS + BATCH_HOOKS)
    if called:
        notes.append(f"the module's {', '.join(called)} (Lightning hooks) are called where Lightning's Trainer calls "
                     f"them, once a process, on the module (what they change, every device's copy gets; what they "
                     f"log, the epoch's row; a batch's hook, its step's row, as Lightning's on_step)")
    around = overridden(model, AROUND["validation_step"])
    if around:
        notes.append(f"the module's {' and '.join(around)} run around validation_step on each device's copy, with "
                     f"its part of the batch and that part's outputs (as Lightning's DDP runs them on each rank): "
                     f"what they log, and append to the module's lists, is kept as the step's")
    kept = overridden(model, ["on_save_checkpoint", "on_load_checkpoint"])
    if kept:
        notes.append(f"the module's {' and '.join(kept)} keep its own entries in the run's checkpoint "
                     f"(checkpoint_dir=): a dict of them, beside the weights, optimizer and epoch fit keeps itself")
    grads = overridden(model, GRADIENT_HOOKS)
    if grads:
        notes.append(f"the module's {' and '.join(grads)} see each update's whole gradient in p.grad (summed over "
                     f"every device and process, before clipping), given after the update: read-only, and a copy of "
                     f"the gradients each update")


def adopted(model: nn.Module, what: Dict[str, Any]) -> bool:
    """Whether the model is taken as a LightningModule: it has ``training_step`` and ``what``
    (the keywords given) holds no ``step``, ``loss`` or ``forward``."""
    return callable(getattr(unwrapped(model), "training_step", None)) \
        and all(what.get(k) is None for k in ("step", "loss", "forward"))


def steps_of(model: nn.Module, what: Dict[str, Any], testing: bool = False) -> Optional[LightningSteps]:
    """The step of a model ``adopted``; else None. ``testing`` (``dptrain.evaluate``, Lightning's
    ``trainer.test``): its ``test_step`` evaluates where it has one, and nothing trains."""
    if not adopted(model, what):
        return None
    model = unwrapped(model)
    if testing and getattr(model, "automatic_optimization", True) is False \
            and not overridden(model, ["test_step", "validation_step"]):
        raise ValueError("the module turns Lightning's automatic_optimization off (its training_step steps its "
                         "optimizers) and has no test_step or validation_step to evaluate it: give it one returning "
                         "(or self.log-ging) the loss, or give evaluate loss= (with forward= if model(x) is not the "
                         "output)")
    if testing:
        steps = LightningSteps(model, "test_step" if overridden(model, ["test_step"]) else "validation_step", False)
        steps.eval_stage = "test"
        return steps
    return LightningSteps(model)


def predict_step_of(model: nn.Module) -> Optional[Callable[[nn.Module, Any, int], Any]]:
    """A LightningModule's own ``predict_step`` as ``fn(replica, batch, batch_idx)`` (Lightning's
    ``trainer.predict`` calls it on each batch as the loader gives it); None without one."""
    model = unwrapped(model)
    if not overridden(model, ["predict_step"]):
        return None
    with_index = takes(model.predict_step, 2)

    def call(net: nn.Module, batch: Any, index: int) -> Any:
        method = type(net._modules.get("_orig_mod", net)).predict_step.__get__(net)
        return method(batch, index) if with_index else method(batch)
    return call


def adopt(model: nn.Module, what: Dict[str, Any], stand_in: TrainerStandIn) -> List[str]:
    """Fill ``what`` (``fit``'s task keywords) from a ``LightningModule``'s methods where it
    does not say; return a line for each taken. ``stand_in``: its trainer for the run, if it
    has none (``lightning_trainer.py``; ``detach`` after the run), which calls its
    ``configure_optimizers`` once the training data is loaded (``LateConfigure``)."""
    model = unwrapped(model)                # (a DDP script's wrapper: the module inside trains)
    notes, steps = [], steps_of(model, what)
    if steps is not None and attach(model, stand_in):
        steps.clock = stand_in
    if steps is not None and stand_in.datamodule is not None:     # (its batch transfer hooks come first)
        steps.transfer = transfer_of(model, stand_in.datamodule)
        steps.before = before_transfer_of(model, stand_in.datamodule)
    if steps is not None:
        if getattr(model, "automatic_optimization", True) is False:
            steps.manual = ManualOptimization()
            steps.manual.clock = steps.clock
            notes.append("model.automatic_optimization is False: its training_step steps its optimizers "
                         "(self.optimizers(), self.manual_backward), each opt.step() on the gradient summed over "
                         "every device and process, of the batch's mean loss")
        if overridden(model, ["lr_scheduler_step"]) and steps.manual is None:
            steps.lr_scheduler_step = steps.scheduler_step_of(model.lr_scheduler_step)
            notes.append("the module's lr_scheduler_step steps its schedulers at their interval, once a process, on "
                         "the module (as Lightning's Trainer calls it: the plateau's figure as its metric, else None)")
        if overridden(model, ["optimizer_step"]) and steps.manual is None:
            steps.optimizer_step = ModuleStep(model, steps.clock)
            notes.append("the module's optimizer_step makes each update, once a process, on the module: "
                         "optimizer.step(closure=optimizer_closure) is dptrain's whole step (every device's forward "
                         "and backward, the sum, the update), and what it sets in optimizer.param_groups the next "
                         "update takes")
        if overridden(model, ["configure_gradient_clipping"]):
            if steps.manual is None:
                steps.clipping = ModuleClipping(model, stand_in)
                notes.append("the module's configure_gradient_clipping decides each update's clipping, called once a "
                             "process before the update: what it asks self.clip_gradients is the clipping of the "
                             "gradient summed over every device and process (p.grad it cannot read there)")
            else:
                notes.append("the module's configure_gradient_clipping is not called (Lightning's Trainer does not "
                             "call it with automatic_optimization off): clip in training_step with "
                             "self.clip_gradients(opt, ...)")
        if overridden(model, ["configure_callbacks"]):
            notes += with_module_callbacks(model, what)
        _check_hooks(model, notes)
        what["step"] = steps
        notes.append("model.training_step is the step and validation_step evaluates (a LightningModule's): what "
                     "they give self.log is each epoch's figures over its batches (train_acc; val_acc: test_acc)"
                     if steps.validation is None else
                     "model.training_step is the step (a LightningModule's; it also gives the test loss): what it "
                     "gives self.log is each epoch's figures over its batches (train_acc)")
    configure = getattr(model, "configure_optimizers", None)
    if "optimizer" not in what and callable(configure) and takes(configure, 0):
        what["optimizer"] = LateConfigure(configure, stand_in)      # (it may read the run's updates)
        notes.append("the optimizer is model.configure_optimizers()'s (a LightningModule's), called once the "
                     "training data is loaded")
    return notes


def with_module_callbacks(model: nn.Module, what: Dict[str, Any]) -> List[str]:
    """The module's ``configure_callbacks()`` added to fit's ``callbacks``, as Lightning's ``Trainer``
    adds them: each taking the place of those of its class or a base of it (never the base
    ``Callback`` itself); they then are taken as fit's own (a peer's ``EarlyStopping`` as ours,
    its ``ModelCheckpoint`` an error naming ours). Returns the line saying so."""
    theirs = model.configure_callbacks()
    if not theirs:
        return []
    theirs = list(theirs) if isinstance(theirs, (list, tuple)) else [theirs]
    given = list(what.get("callbacks") or [])      # (fit's: a list)
    replaced = {type(c) for c in given
                if type(c).__name__ != "Callback" and any(isinstance(t, type(c)) for t in theirs)}
    what["callbacks"] = [c for c in given if type(c) not in replaced] + theirs
    names = ", ".join(type(c).__name__ for c in theirs)
    return [f"the module's configure_callbacks() gave {names}, added to fit's callbacks"
            + (f" in place of its {', '.join(sorted(t.__name__ for t in replaced))} (Lightning's way)" if replaced else "")]


@contextlib.contextmanager
def staged(model: nn.Module, stage: str, steps: Optional[LightningSteps] = None,
           datamodule: Any = None) -> Iterator[Optional[TrainerStandIn]]:
    """``dptrain.evaluate``'s (``"test"``) or ``predict``'s (``"predict"``) stage on the trainer of
    a module with its own ``on_after_batch_transfer`` (which reads ``self.trainer.training``),
    hooks of the evaluation's batches (``on_test_batch_end``...) or of its course (``on_test_epoch_end``): a stand-in saying it while the call
    runs, if the module has no trainer (after ``fit``, it has none); ``steps``: its
    ``LightningSteps``, which then gives it to every device's copy, and the hook of the
    ``datamodule`` given, if it has one (taken first). Yields the stand-in (None: none was needed)."""
    model = unwrapped(model)
    if steps is not None and datamodule is not None:
        steps.transfer = transfer_of(model, datamodule)
        steps.before = before_transfer_of(model, datamodule)
    if transfer_of(model, datamodule) is None and before_transfer_of(model, datamodule) is None and \
            not (steps is not None and (steps.eval_hooks or overridden(model, test_hook_names(steps.evaluation)))):
        yield None
        return
    stand_in = TrainerStandIn(0, None)
    stand_in.stage = stage
    attached = attach(model, stand_in)
    if attached and steps is not None:
        steps.clock = stand_in
    try:
        yield stand_in if attached else None
    finally:
        if attached:
            detach(model)
