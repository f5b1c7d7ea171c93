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

An optimizer that wraps another, made from a class it was given (SAM's
``base_optimizer=torch.optim.Adam``), is built again with that class under the argument's name
(a rebuild made the default's, SGD).

An optimizer whose ``step`` needs a closure (``torch.optim.LBFGS``: a line search evaluates the
loss several times a step; SAM: it evaluates again at perturbed weights) is stepped by ``fit``
with one (``engine/closure_step.py``, ``closure_kind``); a ``Trainer`` of the user's own loop
refuses it before training (``closure_error``).

>>> settings = constructor_settings(opt, groups)     # {"scale": 0.1} for MyOpt(params, scale=0.1)
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Dict, List, Optional

import torch


#: The key of ``constructor_settings`` under which come arguments to build it with (not attributes).
ARGUMENTS = "__init__"


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
    settings = {k: v for k, v in mine.items()
                if k not in ("defaults", "param_groups", "state") and _plain(v) and (k not in theirs or theirs[k] != v)}
    # An optimizer it wraps, made from a class argument (SAM's base_optimizer=torch.optim.Adam): the
    # rebuild made the argument's default (SGD), silently; the class is given again by name.
    wrapped = {k: type(v) for k, v in mine.items()
               if isinstance(v, torch.optim.Optimizer) and type(v) is not type(theirs.get(k))}
    if wrapped:
        takes = inspect.signature(cls.__init__).parameters
        for k, kind in wrapped.items():
            if k not in takes:
                raise TypeError(f"{cls.__name__} keeps {k}, a {kind.__name__}, which building it again for each "
                                f"device as {cls.__name__}(param_groups, **defaults) makes a "
                                f"{type(theirs.get(k)).__name__}: take its class as an argument named {k!r}")
        settings[ARGUMENTS] = wrapped
    return settings


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


def closure_kind(plan: Any, count: int) -> Optional[str]:
    """How the optimizer of ``plan`` (over ``count`` parameters) takes a closure: ``"evaluates"``
    if its ``step`` cannot be called without one (``torch.optim.LBFGS``: it evaluates the loss
    itself, first); ``"after_backward"`` if its ``step()`` fails naming the closure it lacks
    (Sharpness-Aware Minimization's ``assert closure is not None``: it steps on the gradient a
    backward left, then evaluates again); None for the others. Asked of an optimizer outside
    ``torch.optim`` with a ``closure`` argument by one step on stand-in parameters."""
    cls = plan.cls
    if needs_closure(cls):
        return "evaluates"
    try:
        takes = "closure" in inspect.signature(cls.step).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes or cls.__module__.startswith(("torch.optim", "dptrain.")):     # (CombinedOptimizer: its parts')
        return None
    stand_ins = [torch.zeros(1, requires_grad=True) for _ in range(count)]
    for t in stand_ins:
        t.grad = torch.zeros(1)
    try:
        plan.build(stand_ins, range(count))[0].step()
    except Exception as e:          # (any other failure is the real step's to report)
        return "after_backward" if "closure" in str(e).lower() else None
    return None


def closure_error(name: str, where: str = "") -> ValueError:
    """The error for an optimizer whose ``step`` needs a closure where none can be given: a
    ``Trainer`` of the user's own loop (one forward and backward a step, summed over
    devices), an optimizer among several (``where`` says so)."""
    return ValueError(f"{name}.step needs a closure (it evaluates the loss again: a line search, a sharpness-aware "
                      f"step){where}: dptrain.fit steps it with one, over every device and process, when it is the "
                      f"run's only optimizer (optimizer={name}(model.parameters(), ...)); a Trainer's step is one "
                      f"forward and backward, so there use a first-order optimizer (torch.optim.Adam, SGD...)")


def check_no_closure(optimizer: Any, where: str = "") -> None:
    """``closure_error`` for an optimizer whose ``step`` cannot be called without a closure."""
    if needs_closure(type(optimizer)):
        raise closure_error(type(optimizer).__name__, where)
