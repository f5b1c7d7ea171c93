"""Optimizers: Gluon names, or any ``torch.optim`` optimizer, rebuilt for every replica.

A ``Trainer`` needs one optimizer per device (or, with ``kvstore="device"``, one per owner
over the parameters it owns). The user gives one optimizer, in any of these forms:

- a Gluon-style name and its parameters: ``"sgd", {"learning_rate": 0.1, "momentum": 0.9}``.
  Unknown keys are rejected: a typo such as ``{"learning rate": 0.1}`` must not silently
  train with the default rate;
- a ``torch.optim.Optimizer`` class or factory, called with the model's trainable
  parameters: ``torch.optim.AdamW``, ``functools.partial(torch.optim.SGD, lr=0.1)``;
- an optimizer already built on the model (``torch.optim.AdamW(model.parameters())``),
  parameter groups included.

``OptimizerPlan`` remembers the class, its defaults and each group's hyper-parameters by
parameter *index*, so the same optimizer can be built over any replica's parameters.
"""
from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from .optim_settings import ARGUMENTS, NOT_ATTRIBUTES, WRAPPED, constructor_settings

# name -> (torch class, {our key: torch keyword}, fixed keywords, defaults of our keys)
_OPTIMIZERS: Dict[str, Tuple[type, Dict[str, str], Dict[str, Any], Dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"learning_rate": "lr", "momentum": "momentum", "wd": "weight_decay"},
            {}, {"learning_rate": 0.01}),
    "nag": (torch.optim.SGD, {"learning_rate": "lr", "momentum": "momentum", "wd": "weight_decay"},
            {"nesterov": True}, {"learning_rate": 0.01, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"learning_rate": "lr", "beta1": "beta1", "beta2": "beta2",
                                "epsilon": "eps", "wd": "weight_decay"},
             {}, {"learning_rate": 0.001}),
    "adamw": (torch.optim.AdamW, {"learning_rate": "lr", "beta1": "beta1", "beta2": "beta2",
                                  "epsilon": "eps", "wd": "weight_decay"},
              {}, {"learning_rate": 0.001, "wd": 0.01}),
}
OPTIMIZERS = tuple(_OPTIMIZERS)
#: The learning rate of each named optimizer when none is given.
DEFAULT_LRS = {name: spec[3]["learning_rate"] for name, spec in _OPTIMIZERS.items()}

OptimizerSpec = Union[str, type, Callable[..., torch.optim.Optimizer], torch.optim.Optimizer]


def check_learning_rate(lr: Any, what: str = "learning rate") -> float:
    """A learning rate is a finite number >= 0 (0 is where warm-up schedules start)."""
    if isinstance(lr, torch.Tensor) and lr.numel() == 1:
        lr = lr.item()
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {lr!r}")
    return float(lr)


def check_optimizer(name: str, params: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Validate an optimizer name and its parameters; return them with defaults filled in."""
    if not isinstance(name, str) or name.lower() not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}, or pass a "
                         f"torch.optim class such as torch.optim.AdamW")
    _, keys, _, defaults = _OPTIMIZERS[name.lower()]
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"optimizer_params must be a dict such as {{'learning_rate': 0.1}}, got "
                        f"{type(params).__name__}")
    params = dict(params or {})
    unknown = sorted(set(params) - set(keys))
    if unknown:
        raise ValueError(f"unknown optimizer_params key(s) {', '.join(repr(k) for k in unknown)} for "
                         f"{name!r}; valid keys: {', '.join(keys)}")
    for key, value in params.items():
        if key == "learning_rate":
            check_learning_rate(value, "optimizer_params['learning_rate']")
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or value < 0:
            raise ValueError(f"optimizer_params[{key!r}] must be a finite number >= 0, got {value!r}")
    return {**defaults, **params}


def make_optimizer(name: str, params: Mapping[str, Any], tensors: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """Build the torch optimizer for a Gluon-style ``name`` over ``tensors``."""
    cls, keys, fixed, _ = _OPTIMIZERS[name.lower()]
    kwargs: Dict[str, Any] = dict(fixed)
    betas: List[float] = [0.9, 0.999]
    for key, value in check_optimizer(name, params).items():
        target = keys[key]
        if target == "beta1":
            betas[0] = value
        elif target == "beta2":
            betas[1] = value
        else:
            kwargs[target] = value
    if "betas" in _keywords(cls):
        kwargs["betas"] = tuple(betas)
    return cls(list(tensors), **_fast(kwargs, cls))


class OptimizerPlan:
    """An optimizer's class, defaults and groups (by parameter index), to rebuild it anywhere.

    >>> plan = OptimizerPlan.resolve(torch.optim.AdamW, None, list(model.parameters()))
    >>> opt = plan.build(replica_params, range(len(replica_params)))   # same groups, same lrs
    """

    def __init__(self, cls: type, defaults: Dict[str, Any], groups: List[Tuple[List[int], Dict[str, Any]]],
                 settings: Optional[Dict[str, Any]] = None):
        self.cls, self.defaults, self.groups = cls, defaults, groups
        self.settings = settings or {}      # attributes outside defaults (optim_settings.py)
        self.label = cls.__name__       # what checkpoints and the run's header call it
        self.source: Optional[torch.optim.Optimizer] = None     # what ``resolve`` read it from

    @classmethod
    def resolve(cls, spec: OptimizerSpec, optimizer_params: Optional[Mapping[str, Any]],
                params: Sequence[torch.Tensor], every: Optional[Sequence[torch.Tensor]] = None) -> "OptimizerPlan":
        """Read any optimizer form (see the module docstring) over ``params``, the trainable
        parameters of device 0's replica; groups name them by their index in ``every`` (all
        of its parameters, frozen ones too: an optimizer built on ``model.parameters()`` keeps
        its frozen ones, which train once unfrozen; default ``params``)."""
        if isinstance(spec, str):
            optimizer = make_optimizer(spec, check_optimizer(spec, optimizer_params), params)
        elif isinstance(spec, torch.optim.Optimizer):
            optimizer = spec
        elif callable(spec):
            if optimizer_params:
                raise ValueError("optimizer_params go with an optimizer name such as 'sgd'; for a torch.optim "
                                 "class pass its arguments with functools.partial(torch.optim.SGD, lr=0.1)")
            try:
                optimizer = spec(list(params))
            except AttributeError as e:         # a factory of the model: lambda model: AdamW(model.parameters())
                if "'list' object has no attribute" not in str(e):
                    raise
                raise TypeError(f"the optimizer factory was given the list of parameters, as a torch.optim class "
                                f"is, and failed ({e}): for parameter groups or names, build the optimizer on the "
                                f"model and pass it (optimizer=torch.optim.AdamW([{{'params': ...}}, ...]))") from e
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(f"the optimizer factory returned {type(optimizer).__name__}, not a "
                                f"torch.optim.Optimizer")
        else:
            raise TypeError(f"optimizer must be a name ('sgd', 'adam', ...), a torch.optim class or factory, or "
                            f"a torch.optim.Optimizer, got {type(spec).__name__}")
        plan = cls.from_optimizer(optimizer, params if every is None else every)
        plan.source = optimizer         # (the object read: its step hooks are the user's, layout.py)
        return plan

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> "OptimizerPlan":
        from .combined import CombinedOptimizer, CombinedPlan      # (combined.py builds on this module)
        if isinstance(optimizer, CombinedOptimizer):
            return CombinedPlan.of(optimizer, params)
        groups = _groups_of(optimizer, params)
        accepted = _keywords(type(optimizer))
        def plan_of(inner: torch.optim.Optimizer) -> Tuple["OptimizerPlan", torch.optim.Optimizer]:
            plan = cls.from_optimizer(inner, params)        # (a Lookahead's: its groups are the wrapper's)
            return plan, plan.build(params, range(len(params)))[0]
        settings = constructor_settings(optimizer, [dict(g) for g in optimizer.param_groups],
                                        {k: v for k, v in optimizer.defaults.items() if k in accepted}, plan_of)
        return cls(type(optimizer), dict(optimizer.defaults), groups, settings)

    def regrouped(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> "OptimizerPlan":
        """This plan's class and defaults, with the groups ``optimizer`` has now (the
        ``ReplicatedOptimizer``, after ``add_param_group`` or a scheduler's changes)."""
        return OptimizerPlan(self.cls, self.defaults, _groups_of(optimizer, params), self.settings)

    def build(self, tensors: Sequence[torch.Tensor], indices: Iterable[int]) -> Tuple[torch.optim.Optimizer, List[int]]:
        """The optimizer over ``tensors`` (parameter ``indices[k]`` is ``tensors[k]``), and for
        each of its groups the index of the plan's group it came from."""
        indices = list(indices)
        where = {j: k for k, j in enumerate(indices)}
        groups, origin = [], []
        for g, (members, hyper) in enumerate(self.groups):
            mine = [tensors[where[j]] for j in members if j in where]
            if mine:
                groups.append({"params": mine, **(_fast(hyper) if len(mine) >= FOREACH_FROM else hyper)})
                origin.append(g)
        if not groups:      # a device that updates nothing still gets an optimizer (over none)
            groups, origin = [{"params": [torch.zeros(0, requires_grad=True)], **_fast(self.groups[0][1])}], [0]
        accepted = _keywords(self.cls)      # defaults may hold keys the constructor does not take
        wrapped = self.settings.get(WRAPPED)        # built on an optimizer (a Lookahead): that one first
        first = groups if wrapped is None else OptimizerPlan(
            wrapped.cls, wrapped.defaults, self.groups, wrapped.settings).build(tensors, indices)[0]
        optimizer = self.cls(first, **{k: v for k, v in _fast(self.defaults).items() if k in accepted},
                             **self.settings.get(ARGUMENTS, {}))      # (a wrapped optimizer's class)
        for key, value in self.settings.items():
            if key not in NOT_ATTRIBUTES:
                setattr(optimizer, key, copy.deepcopy(value))
        return optimizer, origin

    def managed(self) -> List[int]:
        """The parameter indices some group updates."""
        return sorted({j for members, _ in self.groups for j in members})

    def restricted(self, keep: Sequence[int]) -> "OptimizerPlan":
        """The same plan over the parameters ``keep`` only, renumbered in that order."""
        where = {j: k for k, j in enumerate(keep)}
        return OptimizerPlan(self.cls, self.defaults,
                             [([where[j] for j in members if j in where], hyper) for members, hyper in self.groups],
                             self.settings)


def _groups_of(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> List[Tuple[List[int], Dict[str, Any]]]:
    """Each group's members (their indices in ``params``) and hyper-parameters."""
    index = {id(p): j for j, p in enumerate(params)}
    groups = []
    for g, group in enumerate(optimizer.param_groups):
        members = []
        for p in group["params"]:
            if id(p) not in index:
                if getattr(p, "requires_grad", True):
                    raise ValueError(f"the optimizer's group {g} holds a tensor of shape {tuple(p.shape)} "
                                     f"that is not a parameter of the model: build the optimizer on "
                                     f"model.parameters(), and add groups of the model's own parameters")
                continue            # a frozen tensor of no module: never updated
            members.append(index[id(p)])
        hyper = {k: v for k, v in group.items() if k != "params"}
        if hyper.get("lr", 0.0) is not None:        # (None: the optimizer finds its own, Adafactor's relative step)
            check_learning_rate(hyper.get("lr", 0.0), f"the learning rate of parameter group {g}")
        groups.append((members, hyper))
    return groups


def _keywords(cls: type) -> set:
    try:
        return set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return set()


#: Groups of this many tensors or more are updated with one fused call (below).
FOREACH_FROM = 8


def _fast(hyper: Dict[str, Any], cls: Optional[type] = None) -> Dict[str, Any]:
    # One fused call per step for all parameters, also on the CPU (where PyTorch's default is
    # a loop): measured 0.55 -> 0.2 ms per LeNet step. Same arithmetic, per tensor. For a few
    # tensors PyTorch's loop is faster (torch 2.13, SGD step + zero_grad: 4 tensors 27 against
    # 33 us; 10 tensors equal; 16 tensors 123 against 108 us): groups of fewer than
    # FOREACH_FROM tensors keep PyTorch's default.
    can = "foreach" in hyper if cls is None else "foreach" in _keywords(cls)
    if can and hyper.get("foreach") is None and not hyper.get("fused"):
        return {**hyper, "foreach": True}
    return hyper
