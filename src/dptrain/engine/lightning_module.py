"""A ``LightningModule`` handed to ``fit`` as it is: its ``training_step`` is the step and its
``configure_optimizers()`` the optimizer, as Lightning's ``Trainer`` takes them.

    dptrain.fit(lit_model, train, val, epochs=10)       # trainer.fit(lit_model, train_loader, val_loader)

``adopt`` takes what ``fit`` was not given: a model with ``training_step`` and no ``step``,
``loss`` or ``forward`` trains on ``model.training_step(batch, batch_idx)`` (its loss, or a
dict holding it: a mean over each device's part, as DDP takes it), evaluated by its
``validation_step`` when that returns the loss (else by ``training_step``, under
``torch.no_grad()``: most only ``self.log`` it); a ``configure_optimizers`` that takes no
argument gives the optimizer and its scheduler (``lightning_config.py`` reads its forms).
``dptrain.evaluate`` takes the step alike (``steps_of``), so its figures are ``fit``'s.
Figures given to ``self.log`` are not recorded (Lightning warns that no ``Trainer`` holds the
module): the run's figures are its ``train_loss``, ``test_loss`` and ``metrics=``.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

from torch import nn


def _positional(method: Any) -> Optional[int]:
    """How many positional arguments a bound method takes (None: any number)."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _required(method: Any) -> int:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


class LightningSteps:
    """``step=``: ``model.training_step(batch, batch_idx)`` while the model trains; evaluating,
    ``model.validation_step(batch, batch_idx)`` if it returns the loss (asked once), else
    ``training_step``. ``batch_idx`` is the batch's index in its epoch (or evaluation), which
    the loop and the evaluation set with ``at``."""

    def __init__(self, model: nn.Module):
        self.index = 0
        self.takes_index = _positional(model.training_step) != 1
        validate = getattr(model, "validation_step", None)
        self.validation: Optional[bool] = None if callable(validate) else False     # (None: not yet asked)

    def at(self, index: int) -> None:
        self.index = index

    def _call(self, method: Any, batch: Any) -> Any:
        return method(batch, self.index) if self.takes_index else method(batch)

    def __call__(self, model: nn.Module, batch: Any) -> Any:
        if not model.training and self.validation is not False:
            out = self._call(model.validation_step, batch)
            self.validation = out is not None
            if out is not None:
                return out
        out = self._call(model.training_step, batch)
        if out is None:
            raise ValueError("model.training_step returned None: return the loss (or a dict with 'loss'); a step "
                             "returning None skips the batch in Lightning, which dptrain does not do (on_nan='skip' "
                             "skips a batch whose loss is not finite)")
        return out


def steps_of(model: nn.Module, what: Dict[str, Any]) -> Optional[LightningSteps]:
    """The step of a model with ``training_step`` given no ``step``, ``loss`` or ``forward``
    (``what``: the keywords given); else None."""
    if any(what.get(k) is not None for k in ("step", "loss", "forward")) \
            or not callable(getattr(model, "training_step", None)):
        return None
    return LightningSteps(model)


def adopt(model: nn.Module, what: Dict[str, Any]) -> List[str]:
    """Fill ``what`` (``fit``'s task keywords) from a ``LightningModule``'s methods where it
    does not say; return a line for each taken."""
    notes, steps = [], steps_of(model, what)
    if steps is not None:
        if getattr(model, "automatic_optimization", True) is False:
            raise ValueError("the model turns Lightning's automatic_optimization off (its training_step steps its "
                             "optimizers itself), which fit does not run: give fit step=fn(model, batch) -> loss, "
                             "and optimizer= (a dict of them, with step= a dict, for updates in turn: a GAN)")
        what["step"] = steps
        notes.append("model.training_step is the step (a LightningModule's; validation_step evaluates if it "
                     "returns the loss): the figures are its loss, not what self.log is given (metrics= adds some)")
    configure = getattr(model, "configure_optimizers", None)
    if "optimizer" not in what and callable(configure) and _required(configure) == 0:
        optimizer = configure()
        if optimizer is not None:
            what["optimizer"] = optimizer
            notes.append("the optimizer is model.configure_optimizers()'s (a LightningModule's)")
    return notes
