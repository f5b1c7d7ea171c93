"""Several optimizers on one loss, stepped as one: ``CombinedOptimizer``.

Muon for a network's matrices and AdamW for the rest; SparseAdam for an embedding and Adam
for the others: each parameter has its optimizer, and one backward feeds them all. A plain
loop steps each after ``loss.backward()``; dptrain takes them as one optimizer whose groups
are all of theirs, in order:

    optimizer = dptrain.CombinedOptimizer({"muon": Muon(matrices, lr=0.02),
                                           "adamw": AdamW(others, lr=3e-4)})
    dptrain.fit(model, data, optimizer=optimizer)      # or optimizer={"muon": ..., "adamw": ...}

So every feature of one optimizer holds as it is: one gradient sum (one set of buckets), the
clipping norm over every parameter (what ``clip_grad_norm_(model.parameters())`` takes),
gradient accumulation, float16's loss scale, a skipped update skipping them all, one
scheduler over all the groups (``LambdaLR`` takes a function per group) or one per part,
checkpoints. Its ``step`` and ``zero_grad`` are each part's; its ``state`` and
``state_dict`` are theirs, laid out as one optimizer's (positions running on from part to
part), so code written for one optimizer reads and loads it. The parts are the user's objects: they hold the state as it
goes, and ``fit`` gives it back to them at its end.

``CombinedPlan`` (the ``OptimizerPlan`` of a combined optimizer) builds one per device over
the parameters that device updates, leaving out the parts it has none of. A scheduler for
each part attaches to an ``OptimizerPart`` (``trainer.optimizer.parts[name]``): that part's
groups of the whole, stepped when the whole is.
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Dict, Iterator, List, Sequence, Tuple, Union

import torch

from . import bare_step
from .optim import OptimizerPlan, _groups_of
from .step_traits import check_no_closure


class _States(MutableMapping):
    """The parts' ``state`` as one mapping by parameter (each entry lives in its part's)."""

    def __init__(self, combined: "CombinedOptimizer"):
        self._combined = combined

    def _part(self, p: torch.Tensor) -> torch.optim.Optimizer:
        for part in self._combined.optimizers.values():
            if any(q is p for g in part.param_groups for q in g["params"]):
                return part
        raise KeyError(p)

    def __getitem__(self, p: torch.Tensor) -> Any:
        for part in self._combined.optimizers.values():
            if p in part.state:
                return part.state[p]
        raise KeyError(p)

    def __setitem__(self, p: torch.Tensor, value: Any) -> None:
        self._part(p).state[p] = value

    def __delitem__(self, p: torch.Tensor) -> None:
        for part in self._combined.optimizers.values():
            if p in part.state:
                del part.state[p]
                return
        raise KeyError(p)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for part in self._combined.optimizers.values():
            yield from part.state

    def __len__(self) -> int:
        return sum(len(part.state) for part in self._combined.optimizers.values())


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers, each over its own parameters, as one; see the module docstring.

    ``optimizers``: ``{name: optimizer}`` or a list of them (named by their class, ``adamw``;
    ``adamw_1`` for a second one of a class). No parameter may be in two of them.
    """

    def __init__(self, optimizers: Union[Mapping[str, torch.optim.Optimizer], Sequence[torch.optim.Optimizer]],
                 *, label: str = ""):
        self.optimizers = _named(optimizers)
        #: What the optimizer is called (``Muon+AdamW``), also in checkpoints: the same for a
        #: device's part of it (``CombinedPlan.build``) as for the whole.
        self.label = label or "+".join(type(o).__name__ for o in self.optimizers.values())
        params, owner = [], {}
        for name, o in self.optimizers.items():
            for g in o.param_groups:
                for p in g["params"]:
                    if owner.setdefault(id(p), name) != name:
                        raise ValueError(f"a parameter of shape {tuple(p.shape)} is in optimizer[{owner[id(p)]!r}] "
                                         f"and optimizer[{name!r}]: each parameter is updated by one optimizer")
                    params.append(p)
        super().__init__(params, {})

    # torch.optim.Optimizer keeps these as attributes; here they are the parts' own.
    @property
    def param_groups(self) -> List[Dict[str, Any]]:        # type: ignore[override]
        """Every part's groups, in order (the same dicts: a learning rate set here is theirs)."""
        return [g for o in self.optimizers.values() for g in o.param_groups]

    @param_groups.setter
    def param_groups(self, value: Any) -> None:     # (torch's __init__ sets it; the parts hold them)
        pass

    @property
    def state(self) -> MutableMapping:                # type: ignore[override]
        return _States(self)

    @state.setter
    def state(self, value: Any) -> None:
        pass

    def step(self, closure=None):       # noqa: D102 - each part's step
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers.values():
            bare_step.step(o)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers.values():
            o.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not getattr(self, "_built", False):      # torch's __init__ adding them: the parts hold them
            self._built = True
            return
        raise ValueError("add_param_group on a CombinedOptimizer: add the group to the one of its optimizers "
                         "that is to update it (optimizer.optimizers[name].add_param_group)")

    def state_dict(self) -> Dict[str, Any]:
        """The parts' state dicts as one optimizer's: positions run on from part to part."""
        state, groups, offset = {}, [], 0
        for o in self.optimizers.values():
            own = o.state_dict()
            state.update({position + offset: s for position, s in own["state"].items()})
            groups += [{**g, "params": [position + offset for position in g["params"]]} for g in own["param_groups"]]
            offset += sum(len(g["params"]) for g in o.param_groups)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load what ``state_dict`` gave (a ValueError unless it has as many groups as this)."""
        groups = list(state_dict["param_groups"])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(groups)} parameter groups, this {self.label} has "
                             f"{len(self.param_groups)}: load one saved by the same optimizers")
        first, offset = 0, 0
        for o in self.optimizers.values():
            mine = groups[first:first + len(o.param_groups)]
            count = sum(len(g["params"]) for g in o.param_groups)
            o.load_state_dict({
                "state": {int(k) - offset: s for k, s in state_dict["state"].items()
                          if offset <= int(k) < offset + count},
                "param_groups": [{**g, "params": [position - offset for position in g["params"]]} for g in mine]})
            first, offset = first + len(mine), offset + count

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"CombinedOptimizer({', '.join(f'{k}: {type(o).__name__}' for k, o in self.optimizers.items())})"


def _named(optimizers: Any) -> Dict[str, torch.optim.Optimizer]:
    if isinstance(optimizers, Mapping):
        named = dict(optimizers)
    elif isinstance(optimizers, (list, tuple)):
        named, seen = {}, {}
        for o in optimizers:
            base = type(o).__name__.lower()
            seen[base] = seen.get(base, 0) + 1
            named[base if seen[base] == 1 else f"{base}_{seen[base] - 1}"] = o
    else:
        raise TypeError(f"CombinedOptimizer takes {{name: optimizer}} or a list of optimizers, got "
                        f"{type(optimizers).__name__}")
    if not named:
        raise ValueError("CombinedOptimizer needs at least one optimizer")
    for name, o in named.items():
        if not isinstance(o, torch.optim.Optimizer) or isinstance(o, CombinedOptimizer):
            raise TypeError(f"optimizer[{name!r}] must be an optimizer built on the parameters it updates, e.g. "
                            f"torch.optim.AdamW(other_params, lr=3e-4); got {type(o).__name__}")
    return named


class OptimizerPart(torch.optim.Optimizer):
    """One optimizer of a combined one as a scheduler sees it: ``param_groups`` are that part's
    groups of ``whole`` (the same dicts, so a rate set here is the whole's), ``step`` marks the
    whole's step (``ReplicatedOptimizer.step`` calls it; it updates nothing itself).

    >>> cosine = torch.optim.lr_scheduler.CosineAnnealingLR(trainer.optimizer.parts["muon"], T_max=100)
    """

    def __init__(self, whole: torch.optim.Optimizer, name: str, first: int, count: int, defaults: Dict[str, Any]):
        self.name, self._whole, self._span = name, whole, slice(first, first + count)
        super().__init__([torch.zeros(0)], dict(defaults))     # (torch's __init__ wants a tensor; none is kept)
        self.state = {}

    @property
    def param_groups(self) -> List[Dict[str, Any]]:        # type: ignore[override]
        return self._whole.param_groups[self._span]

    @param_groups.setter
    def param_groups(self, value: Any) -> None:     # (torch's __init__ sets it; the whole holds them)
        pass

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if getattr(self, "_built", False):
            raise ValueError(f"add_param_group on optimizer part {self.name!r} of a run: add the group to your "
                             f"optimizer before fit")
        self._built = True

    def step(self, closure=None):       # noqa: D102 - see the class docstring
        return None
    step.hooked = True      # (no profiler record per call: see ReplicatedOptimizer.step)

    def zero_grad(self, set_to_none: bool = True) -> None:
        raise ValueError(f"zero_grad on optimizer part {self.name!r}: gradients are the whole optimizer's "
                         f"(trainer.optimizer.zero_grad())")

    def __repr__(self) -> str:
        return f"OptimizerPart({self.name!r}, groups {self._span.start}-{self._span.stop - 1})"


class CombinedPlan(OptimizerPlan):
    """The plan of a ``CombinedOptimizer``: one ``OptimizerPlan`` per part, their groups in
    order (``groups`` numbers them as the combined optimizer's ``param_groups`` do)."""

    def __init__(self, parts: Mapping[str, OptimizerPlan], label: str):
        self.parts = dict(parts)
        super().__init__(CombinedOptimizer, {}, [g for part in self.parts.values() for g in part.groups])
        self.label = label

    def made_parts(self, whole: torch.optim.Optimizer) -> Dict[str, OptimizerPart]:
        """Each part of ``whole`` (whose groups are this plan's, in order), by name."""
        return {name: OptimizerPart(whole, name, first, len(self.parts[name].groups), self.parts[name].defaults)
                for name, first in self.first_groups.items()}

    @property
    def first_groups(self) -> Dict[str, int]:
        """Each part's first group, by its index among ``groups``."""
        firsts, first = {}, 0
        for name, part in self.parts.items():
            firsts[name] = first
            first += len(part.groups)
        return firsts

    @classmethod
    def of(cls, optimizer: CombinedOptimizer, params: Sequence[torch.Tensor]) -> "CombinedPlan":
        for o in optimizer.optimizers.values():
            check_no_closure(o, ", and it is combined with other optimizers")
        return cls({name: OptimizerPlan.from_optimizer(o, params) for name, o in optimizer.optimizers.items()},
                   optimizer.label)

    def _split(self, groups: List[Tuple[List[int], Dict[str, Any]]]) -> "CombinedPlan":
        parts, first = {}, 0
        for name, part in self.parts.items():
            parts[name] = OptimizerPlan(part.cls, part.defaults, groups[first:first + len(part.groups)], part.settings)
            first += len(part.groups)
        return CombinedPlan(parts, self.label)

    def regrouped(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> "CombinedPlan":
        groups = _groups_of(optimizer, params)
        if len(groups) != len(self.groups):
            raise ValueError(f"a parameter group was added to the {self.label} optimizer of the run: with "
                             f"several optimizers combined, add it to one of them before fit "
                             f"(optimizers[name].add_param_group)")
        return self._split(groups)

    def restricted(self, keep: Sequence[int]) -> "CombinedPlan":
        return CombinedPlan({name: part.restricted(keep) for name, part in self.parts.items()}, self.label)

    def build(self, tensors: Sequence[torch.Tensor], indices) -> Tuple[torch.optim.Optimizer, List[int]]:
        indices = list(indices)
        present = set(indices)
        built, origin, first = {}, [], 0
        for name, part in self.parts.items():
            if any(j in present for members, _ in part.groups for j in members):
                optimizer, own = part.build(tensors, indices)
                built[name] = optimizer
                origin += [first + g for g in own]
            first += len(part.groups)
        if not built:       # a device that updates nothing: a step over no parameter
            return torch.optim.SGD([torch.zeros(0, requires_grad=True)], lr=0.0), [0]
        return CombinedOptimizer(built, label=self.label), origin
