"""A ``LightningModule``'s own hooks of the run's course, called by ``fit`` where Lightning's
``Trainer`` calls them: ``on_fit_start`` and ``on_train_start`` as the run starts,
``on_train_epoch_start`` before each epoch's first batch, ``on_train_end`` and ``on_fit_end``
as it ends (also when it stops early), after the callbacks given to ``fit`` (Lightning calls
its callbacks' hooks first too).

    class FineTune(L.LightningModule):
        def on_train_epoch_start(self):
            if self.current_epoch == 2:            # the backbone trains from the third epoch
                self.backbone.requires_grad_(True)

Each is called once in a process, on the module (the first device's replica); what it changes
there is given to the other devices' copies as a callback's edits are (``ModelEdits``: a layer
unfrozen trains on every device). Its ``self.current_epoch`` and ``self.global_step`` are the
run's. The hooks that read what the steps kept (``on_train_epoch_end``,
``on_validation_epoch_end`` over a list of outputs) are not called: each device's copy keeps
its own part (``lightning_module.py`` names them in a line).
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from torch import nn

from ..engine.lightning_module import COURSE_HOOKS, LightningSteps, overridden
from ..parallel.given_model import unwrapped
from .base import Callback

#: The module's hooks called, by the callback event that calls them (in Lightning's order).
CALLED = {"on_fit_start": ("on_fit_start", "on_train_start"), "on_epoch_start": ("on_train_epoch_start",),
          "on_fit_end": ("on_train_end", "on_fit_end")}


def with_module_hooks(model: nn.Module, what: Dict[str, Any]) -> None:
    """Add to ``what``'s callbacks (``fit``'s keywords) the caller of the hooks of the run's
    course the model overrides, when it was taken as a LightningModule (its step is ours)."""
    steps = what.get("step")
    model = unwrapped(model)
    hooks = overridden(model, COURSE_HOOKS) if isinstance(steps, LightningSteps) else []
    if hooks:
        given = what.get("callbacks") or []
        listed: List[Any] = list(given) if isinstance(given, (list, tuple)) else [given]
        what["callbacks"] = listed + [ModuleHooks(model, hooks, steps.clock)]


class ModuleHooks(Callback):
    """Calls ``hooks`` (those of ``COURSE_HOOKS`` the module overrides) of ``module`` at their points;
    ``clock``: the module's stand-in trainer (None: it has its own), set to the epoch first."""

    def __init__(self, module: nn.Module, hooks: Sequence[str], clock: Any = None):
        self.module, self.hooks, self.clock = module, tuple(hooks), clock

    def _call(self, event: str, run: Any, epochs_done: int) -> None:
        if self.clock is not None:
            self.clock.at(epochs_done, run.step)
        for hook in CALLED[event]:
            if hook in self.hooks:
                getattr(self.module, hook)()

    def on_fit_start(self, run: Any) -> None:
        self._call("on_fit_start", run, run.epoch - 1)

    def on_epoch_start(self, run: Any, epoch: int) -> None:
        self._call("on_epoch_start", run, epoch - 1)

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        self._call("on_fit_end", run, run.epoch)         # (Lightning's: the epochs done)
