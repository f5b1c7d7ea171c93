"""A LightningModule's own ``configure_gradient_clipping``: each update's clipping, decided by the module.

Lightning's documented use turns clipping on (or changes it) as the run goes::

    def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
        if self.current_epoch >= 5:
            self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")

``fit`` calls it once a process before each update, on the module, with the run's optimizer
and what Lightning's ``Trainer`` would pass: ``gradient_clip_val`` fit's ``clip_grad_norm`` (its
``gradient_clip_algorithm`` ``"norm"``) or ``clip_grad_value`` (``"value"``), else None, which
the module's ``trainer.gradient_clip_val`` and ``gradient_clip_algorithm`` say too. What its
``self.clip_gradients`` asks is that update's clipping of the whole gradient (summed over every
device and process), as ``clip_grad_norm=`` or ``clip_grad_value=`` clip it, and as Lightning's
does: without a value, fit's (or none); a value or algorithm other than fit's is an error; a
value of 0 clips nothing; a norm and then a value, both (in that order: dptrain's). A hook that
asks nothing leaves that update unclipped, as in Lightning.

Lightning calls the hook after backward, with ``p.grad`` filled; fit sums the gradient inside
its step, after the hook, so the hook cannot read or change ``p.grad``. What it reads of the run
(``current_epoch``, ``global_step``: the updates done) is what Lightning's would. A hook whose own
code reaches for the gradients (``.grad``, ``clip_grad_norm_``) is refused with the fix
(``ModuleClipping``), not run to clip nothing; every process's hook must ask the same (as under
Lightning's DDP), or their replicas part.
"""
from __future__ import annotations

import inspect
import io
import math
import tokenize
from typing import Any, List, Optional, Tuple

from torch import nn

_FIX = ("call self.clip_gradients(optimizer, gradient_clip_val=..., gradient_clip_algorithm='norm' or 'value') "
        "there (fit clips the gradient summed over every device and process with it), or give fit "
        "clip_grad_norm= or clip_grad_value= and remove the hook")
#: Names in a hook's code that reach for the gradients themselves.
_GRADIENT_NAMES = {"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value",
                   "clip_grads_with_norm_", "get_total_norm"}


def reaches_for_gradients(fn: Any) -> bool:
    """Whether ``fn``'s source (where Python has it) reads ``.grad`` or calls torch's clipping."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(inspect.cleandoc("\n" + source)).readline)
              if t.type in (tokenize.NAME, tokenize.OP)]
    return any(t.string in _GRADIENT_NAMES or (t.string == "grad" and k and tokens[k - 1].string == ".")
               for k, t in enumerate(tokens))


class ModuleClipping:
    """The module's ``configure_gradient_clipping``, made into each update's clipping (see the
    module docstring). ``trainer``: the run's ``TrainerStandIn``, which holds fit's clipping."""

    def __init__(self, model: nn.Module, trainer: Any):
        if reaches_for_gradients(type(model).configure_gradient_clipping):
            raise ValueError(f"the module's configure_gradient_clipping reads or clips p.grad itself, which fit "
                             f"cannot give it (Lightning calls it after backward; fit sums the gradient over the "
                             f"devices inside its step, after the hook): {_FIX}")
        self.model, self.trainer = model, trainer
        self.hook = model.configure_gradient_clipping

    def __call__(self, optimizer: Any, reported: bool = False) -> Tuple[Optional[float], Optional[float]]:
        """The update's ``(max_norm, max_value)`` as the hook asks them (``reported``: the run
        logs the gradient's norm, so an update without a norm to clip to still measures it:
        ``math.inf``)."""
        if isinstance(optimizer, dict):
            raise ValueError(f"the module's configure_gradient_clipping with several optimizers "
                             f"({', '.join(optimizer)}): fit clips each update alike; give fit clip_grad_norm= "
                             f"or clip_grad_value= and remove the hook")
        trainer = self.trainer
        if trainer.clip_norm_and_value:
            raise ValueError("fit was given clip_grad_norm and clip_grad_value and the module its own "
                             "configure_gradient_clipping, which passes Lightning's Trainer one of them: give fit "
                             "one, or neither and clip in the hook")
        asked: List[Tuple[str, float]] = []

        def clip_gradients(optimizer: Any, gradient_clip_val: Optional[float] = None,
                           gradient_clip_algorithm: Optional[str] = None) -> None:
            asked.append(asked_clipping(gradient_clip_val, gradient_clip_algorithm, trainer.gradient_clip_val,
                                        trainer.gradient_clip_algorithm))
        self.model.__dict__["clip_gradients"] = clip_gradients      # (the module's self.clip_gradients, now)
        try:
            self.hook(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        finally:
            del self.model.__dict__["clip_gradients"]
        max_norm = max_value = None
        for algorithm, value in asked:
            if value <= 0:
                continue                    # (Lightning's: a value of 0 clips nothing)
            if algorithm == "norm":
                if max_value is not None:
                    raise ValueError("the module's configure_gradient_clipping clips by value and then by norm: "
                                     "fit clips the norm first, then each value; ask them in that order")
                max_norm = value if max_norm is None else min(max_norm, value)   # (clipped twice: to the lesser)
            else:
                max_value = value if max_value is None else min(max_value, value)
        return (math.inf if reported else None) if max_norm is None else max_norm, max_value


def asked_clipping(value: Optional[float], algorithm: Optional[str], given: Optional[float] = None,
                   given_algorithm: Optional[str] = None) -> Tuple[str, float]:
    """``self.clip_gradients(optimizer, value, algorithm)`` as ``(algorithm, value)``, read as
    Lightning's reads it (``given``, ``given_algorithm``: fit's, its Trainer's)."""
    if value is None:
        value = given or 0.0
    elif given is not None and given != value:
        raise ValueError(f"fit was given a clipping of {given!r} and the module's configure_gradient_clipping asks "
                         f"clip_gradients(gradient_clip_val={value!r}): give only one (Lightning's Trainer refuses "
                         f"both alike)")
    if algorithm is None:
        algorithm = given_algorithm or "norm"
    else:
        algorithm = str(algorithm).lower()
        if given_algorithm is not None and given_algorithm != algorithm:
            raise ValueError(f"fit clips by {given_algorithm} and the module's "
                             f"configure_gradient_clipping asks clip_gradients(gradient_clip_algorithm="
                             f"{algorithm!r}): give only one")
    if algorithm not in ("norm", "value"):
        raise ValueError(f"clip_gradients(gradient_clip_algorithm={algorithm!r}): give 'norm' or 'value'")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"clip_gradients(gradient_clip_val={value!r}): give a number")
    return algorithm, float(value)
