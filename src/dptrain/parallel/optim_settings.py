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

An optimizer built on another optimizer, not on parameters (a Lookahead: ``Lookahead(Adam(params),
k=5)``, whose groups are the wrapped one's) cannot be built on groups: the wrapped optimizer is
built again for each device (its own plan, ``WRAPPED``) and the wrapper on it.

Plain attributes its steps change (a step counter) are state: ``attributes_of`` lists them for
checkpoints and for the optimizer object given back (``optim_state.py``).

>>> settings = constructor_settings(opt, groups)     # {"scale": 0.1} for MyOpt(params, scale=0.1)
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch


#: The key of ``constructor_settings`` under which come arguments to build it with (not attributes).
ARGUMENTS = "__init__"
#: The key under which comes the plan of the optimizer it is built on (a Lookahead's), if any.
WRAPPED = "__wrapped__"
#: Keys of ``constructor_settings`` that are not attributes to set.
NOT_ATTRIBUTES = (ARGUMENTS, WRAPPED)


def constructor_settings(optimizer: torch.optim.Optimizer, groups: List[Dict[str, Any]], accepted: Dict[str, Any],
                         plan_of: Optional[Callable[[torch.optim.Optimizer], Tuple[Any, Any]]] = None
                         ) -> Dict[str, Any]:
    """The plain attributes of ``optimizer`` that ``type(optimizer)(groups, **accepted)`` does
    not reproduce (see the module docstring); {} for ``torch.optim``'s own. An optimizer built
    on another that shares its groups (a Lookahead), which cannot be built on groups: built on
    what ``plan_of(that one)`` gives, ``(its plan, an optimizer built from it)``, the plan kept
    under ``WRAPPED``. A ``TypeError`` naming the fix if it cannot be built."""
    cls = type(optimizer)
    if cls.__module__.startswith("torch.optim"):
        return {}
    inner = next((v for v in vars(optimizer).values() if isinstance(v, torch.optim.Optimizer)
                  and v is not optimizer and v.param_groups is optimizer.param_groups), None)
    wrapped_plan = None
    try:
        probe = cls(groups, **accepted)
    except Exception as e:          # (a wrapper given groups fails as it reads them: AttributeError)
        if inner is None or plan_of is None:
            if not isinstance(e, TypeError):
                raise
            raise TypeError(f"{cls.__name__} cannot be built again for each device as {cls.__name__}(param_groups, "
                            f"**defaults) ({e}): give that argument a default, or keep it in the defaults the "
                            f"optimizer passes to torch.optim.Optimizer.__init__(params, defaults)") from e
        wrapped_plan, built = plan_of(inner)
        try:
            probe = cls(built, **accepted)
        except TypeError as e:
            raise TypeError(f"{cls.__name__}, built on a {type(inner).__name__}, cannot be built again for each "
                            f"device as {cls.__name__}({type(inner).__name__}(...)) ({e}): give its other "
                            f"arguments defaults") from e
    mine, theirs = vars(optimizer), vars(probe)
    settings = {k: v for k, v in mine.items()
                if k not in ("defaults", "param_groups", "state") and _plain(v) and (k not in theirs or theirs[k] != v)}
    if wrapped_plan is not None:
        settings[WRAPPED] = wrapped_plan
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


@functools.lru_cache(maxsize=None)
def _torch_attributes() -> frozenset:
    """The attributes every ``torch.optim`` optimizer has (its hooks, its profile name)."""
    return frozenset(vars(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)))


def attributes_of(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """The plain attributes of an optimizer outside ``torch.optim`` (a Lookahead's step counter),
    which its steps may change: checkpoints keep them, a run gives them back ({} for torch's)."""
    if type(optimizer).__module__.startswith(("torch.optim", "dptrain.")):     # (a combined one's parts: not kept)
        return {}
    known = _torch_attributes()
    return {k: v for k, v in vars(optimizer).items() if k not in known and k not in ("defaults", "param_groups",
                                                                                     "state") and _plain(v)}


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
