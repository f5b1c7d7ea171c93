"""What an optimizer's ``step`` needs from the devices, asked once as a Trainer is set up.

- A closure: ``torch.optim.LBFGS`` cannot step without one (a line search evaluates the loss
  several times a step); Sharpness-Aware Minimization fails without one (it evaluates again at
  perturbed weights). ``fit`` steps both with one (``engine/closure_step.py``); a ``Trainer`` of
  the user's own loop refuses them before training (``closure_error``).
- Every parameter at once: kvstore "device" gives each parameter one owner device, whose
  optimizer updates it alone. An optimizer that computes one value over a whole group (Prodigy's
  and D-Adaptation's step size ``d``, kept in the group and changed by each step) would compute it
  over each device's part instead: on another value on each device. Those, and the ones taking a
  closure, are run over every parameter on every device (the Trainer makes the sync "local").

An optimizer outside ``torch.optim`` is asked by one ``step`` on stand-in parameters of one
element (its side effects, if any, happen once, on them): whether it fails for want of a
closure, and whether it changed a group's values. Several optimizers on one loss (a
``CombinedPlan``) need what any of their parts needs.

>>> traits = step_traits(plan, len(params))     # StepTraits(closure=None, whole_groups=True): Prodigy
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch


@dataclass(frozen=True)
class StepTraits:
    #: ``"evaluates"`` if ``step`` cannot be called without a closure (``torch.optim.LBFGS``: it
    #: evaluates the loss itself, first); ``"after_backward"`` if it fails naming the closure it
    #: lacks (SAM: it steps on the gradient a backward left, then evaluates again); else None.
    closure: Optional[str] = None
    #: Whether ``step`` changed a value of its groups (a step size over the whole group).
    changes_groups: bool = False

    @property
    def whole(self) -> bool:
        """Whether every device's optimizer must update every parameter (no owner per parameter)."""
        return self.closure is not None or self.changes_groups


@functools.lru_cache(maxsize=None)
def needs_closure(cls: type) -> bool:
    """Whether the optimizer class's ``step`` needs a closure (``torch.optim.LBFGS``)."""
    try:
        closure = inspect.signature(cls.step).parameters.get("closure")
    except (TypeError, ValueError):         # a step with no signature to read: taken as it is
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def step_traits(plan: Any, count: int) -> StepTraits:
    """What the optimizer of ``plan`` (over ``count`` parameters) needs (see the module docstring)."""
    cls = plan.cls
    if needs_closure(cls):
        return StepTraits(closure="evaluates")
    parts = getattr(plan, "parts", None)        # a CombinedPlan: its parts' (none needs a closure: combined.py)
    if parts is not None:
        return StepTraits(changes_groups=any(step_traits(part, count).changes_groups for part in parts.values()))
    if not custom(plan):
        return StepTraits()
    stand_ins = [torch.zeros(1, requires_grad=True) for _ in range(count)]
    for t in stand_ins:         # (not zero: Prodigy's step does nothing on a zero gradient)
        t.grad = torch.full((1,), 1e-3)
    optimizer = plan.build(stand_ins, range(count))[0]
    before = _values(optimizer.param_groups)
    try:
        optimizer.step()
    except Exception as e:          # (any other failure is the real step's to report)
        return StepTraits(closure="after_backward" if "closure" in str(e).lower() and _takes_closure(cls) else None)
    after = _values(optimizer.param_groups)
    return StepTraits(changes_groups=any(not _same(a.get(k), v) for a, b in zip(before, after) for k, v in b.items()))


def custom(plan: Any) -> bool:
    """Whether the optimizer of ``plan`` (or of a part of it) is of a class outside ``torch.optim``
    and dptrain: one whose step may do what torch's do not (change its groups' values)."""
    parts = getattr(plan, "parts", None)
    if parts is not None:
        return any(custom(part) for part in parts.values())
    return not plan.cls.__module__.startswith(("torch.optim", "dptrain."))


def _takes_closure(cls: type) -> bool:
    try:
        return "closure" in inspect.signature(cls.step).parameters
    except (TypeError, ValueError):
        return False


def _values(groups: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in g.items() if k != "params"}
            for g in groups]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and \
            bool((a == b).all())
    try:
        return bool(a == b)
    except Exception:       # noqa: BLE001 - values that cannot say: taken as unchanged
        return True


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
