"""Settings an optimizer of the user's own keeps outside its ``defaults``.

Every device's optimizer is built again as ``cls(groups, **defaults)`` (``optim.py``). A
``torch.optim`` optimizer keeps all it was given in ``defaults``; one of the user's own may
keep a constructor argument as an attribute (``self.scale = scale``), which a rebuild would
silently set to the argument's default (a run trained with other settings than the ones
given), or need an argument with no default (the rebuild fails).

So an optimizer of another module is built once more on its own parameters, with the same
groups: an attribute that then differs came from the constructor's arguments, not from the
parameters, and every rebuilt optimizer gets the user's value. Attributes compared are plain
values (numbers, strings, None, and tuples, lists and dicts of them); others are left alone.

An optimizer whose ``step`` needs a closure (``torch.optim.LBFGS``: a line search evaluates the
loss several times a step) is stepped by ``fit`` with one (``engine/closure_step.py``); a
``Trainer`` of the user's own loop refuses it before training (``check_no_closure``).

>>> settings = constructor_settings(opt, groups)     # {"scale": 0.1} for MyOpt(params, scale=0.1)
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Dict, List

import torch


def constructor_settings(optimizer: torch.optim.Optimizer, groups: List[Dict[str, Any]],
                         accepted: Dict[str, Any]) -> Dict[str, Any]:
    """The plain attributes of ``optimizer`` that ``type(optimizer)(groups, **accepted)`` does
    not reproduce (see the module docstring); {} for ``torch.optim``'s own. A ``TypeError``
    naming the fix if that call fails."""
    cls = type(optimizer)
    if cls.__module__.startswith("torch.optim"):
        return {}
    try:
        probe = cls(groups, **accepted)
    except TypeError as e:
        raise TypeError(f"{cls.__name__} cannot be built again for each device as {cls.__name__}(param_groups, "
                        f"**defaults) ({e}): give that argument a default, or keep it in the defaults the "
                        f"optimizer passes to torch.optim.Optimizer.__init__(params, defaults)") from e
    mine, theirs = vars(optimizer), vars(probe)
    return {k: v for k, v in mine.items()
            if k not in ("defaults", "param_groups", "state") and _plain(v) and (k not in theirs or theirs[k] != v)}


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


@functools.lru_cache(maxsize=None)
def needs_closure(cls: type) -> bool:
    """Whether the optimizer class's ``step`` needs a closure (``torch.optim.LBFGS``)."""
    try:
        closure = inspect.signature(cls.step).parameters.get("closure")
    except (TypeError, ValueError):         # a step with no signature to read: taken as it is
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def check_no_closure(optimizer: Any, where: str = "") -> None:
    """A ValueError for an optimizer (or class) whose ``step`` needs a closure, where none can
    be given: a ``Trainer`` of the user's own loop (one forward and backward a step, summed
    over devices), an optimizer among several (``where`` says so)."""
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    if needs_closure(cls):
        name = cls.__name__
        raise ValueError(f"{name}.step needs a closure (a line search evaluates the loss several times a step)"
                         f"{where}: dptrain.fit steps it with one, over every device and process, when it is the "
                         f"run's only optimizer (optimizer=torch.optim.{name}, or one built on the model); a "
                         f"Trainer's step is one forward and backward, so there use a first-order optimizer "
                         f"(torch.optim.Adam, SGD...)")
