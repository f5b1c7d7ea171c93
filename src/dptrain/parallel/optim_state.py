"""An optimizer's state in one layout, whatever the devices, kvstore or processes: by the
index of each parameter among the trainable ones, with the groups' hyper-parameters.

Checkpoints save and load it (``Trainer.state_dict``), and it moves between the run's
per-device optimizers and the optimizer object the user built on the model: lent to a run
as it starts, given back as it ends (``Trainer.give_back``).

An optimizer that wraps another (SAM's ``base_optimizer``, an attribute holding an optimizer)
keeps the state of its steps there (Adam's moments): a parameter's state is both, the wrapped
one's keys named ``"<attribute>/<key>"`` (``state_of``, ``loaded``).
"""
from __future__ import annotations

import collections
import copy
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .optim_settings import attributes_of

if TYPE_CHECKING:
    from .replicated_optimizer import ReplicatedOptimizer


def optimizer_state(optimizers: Sequence[torch.optim.Optimizer], groups: Sequence[Sequence[torch.Tensor]],
                    owned: Callable[[int], Optional[List[int]]], replicated: "ReplicatedOptimizer") -> Dict[str, Any]:
    """A Trainer's optimizer state: per parameter, by its index among the trainable ones, and
    the parameter groups' hyper-parameters (learning rates set by schedulers).

    ``optimizers[i]`` updates ``groups[i]`` (device ``i``'s parameters), or only the indices
    ``owned(i)`` (kvstore "device": each parameter has one owner). The layout does not depend
    on the devices, the kvstore or the processes: a state saved on 2 processes loads on 1
    process with 3 devices, and the other way round."""
    state: Dict[int, Dict[str, Any]] = {}
    for i, opt in enumerate(optimizers):
        mine, wrapped = owned(i), _wrapped(opt)
        for j in (range(len(groups[i])) if mine is None else mine):
            if j not in state:
                held = state_of(opt, groups[i][j], wrapped)
                if held is not None:
                    state[j] = held
        if mine is None:        # every device holds the same full state: one is enough
            break
    return {"optimizer": replicated.label, "shapes": [list(p.shape) for p in groups[0]],
            "state": state, "groups": replicated.state_dict()["param_groups"],
            "attributes": copy.deepcopy(attributes_of(optimizers[0]))}


def load_optimizer_state(state: Mapping[str, Any], optimizers: Sequence[torch.optim.Optimizer],
                         groups: Sequence[Sequence[torch.Tensor]],
                         replicated: Optional["ReplicatedOptimizer"] = None) -> None:
    """Load what ``optimizer_state`` gave into ``optimizers`` (over ``groups``), whatever
    devices, kvstore or processes saved it, and its groups' hyper-parameters into
    ``replicated`` (if given: the optimizer it names must be this one); a ValueError names
    what does not match."""
    ours = replicated.label if replicated is not None else state.get("optimizer")
    if state.get("optimizer") != ours:
        raise ValueError(f"the checkpoint's optimizer is {state.get('optimizer')!r}, this run's {ours!r}: "
                         f"resume with the same optimizer")
    shapes = [list(p.shape) for p in groups[0]]
    if state.get("shapes") != shapes:
        raise ValueError(f"the checkpoint's optimizer holds {len(state.get('shapes') or [])} parameters of other "
                         f"shapes than this model's {len(shapes)} trainable ones")
    saved = state.get("state", {})
    for i, opt in enumerate(optimizers):        # a copy each: torch's .to() may alias them
        loaded(opt, _by_position(opt, groups[i], saved, copy=True))
        _set_attributes(opt, state.get("attributes", {}))
    if replicated is not None:      # the hyper-parameters, group by group (its members are the model's)
        if len(state["groups"]) != len(replicated.param_groups):
            raise ValueError(f"the checkpoint's optimizer has {len(state['groups'])} parameter groups, this run's "
                             f"{len(replicated.param_groups)}: resume with the same optimizer")
        for group, saved in zip(replicated.param_groups, state["groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})


def _by_position(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                 saved: Mapping[int, Dict[str, Any]], copy: bool) -> Dict[int, Dict[str, Any]]:
    """``saved`` (by index among ``params``) in torch's own layout for ``optimizer`` (by position
    in its groups), so that its ``load_state_dict`` places each value (Adam's 'step' stays on
    the CPU); positions of parameters not in ``params`` are left out."""
    index = {id(p): j for j, p in enumerate(params)}
    mine, position = {}, 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            j = index.get(id(p))
            if j is not None and j in saved:
                mine[position] = {k: v.clone() if isinstance(v, torch.Tensor) else v
                                  for k, v in saved[j].items()} if copy else saved[j]
            position += 1
    return mine


# -- a rebuild (a layer unfrozen mid-run: Trainer.follow) --------------------------------
def held_states(optimizers: Sequence[torch.optim.Optimizer], groups: Sequence[Sequence[torch.Tensor]],
                kept: Sequence[int]) -> List[Dict[int, Dict[str, Any]]]:
    """Each device's optimizer state (``optimizers[i]`` over ``groups[i]``, the parameters
    ``kept`` of the model), by parameter index in the model."""
    held = []
    for optimizer, params in zip(optimizers, groups):
        wrapped = _wrapped(optimizer)
        if not wrapped:         # (the dicts themselves: no copies)
            index = {id(p): kept[k] for k, p in enumerate(params)}
            held.append({index[id(p)]: s for p, s in optimizer.state.items() if id(p) in index})
            continue
        states = {kept[k]: state_of(optimizer, p, wrapped) for k, p in enumerate(params)}
        held.append({j: s for j, s in states.items() if s is not None})
    return held


def carry_states(held: Sequence[Dict[int, Dict[str, Any]]], optimizers: Sequence[torch.optim.Optimizer],
                 groups: Sequence[Sequence[torch.Tensor]], kept: Sequence[int]) -> None:
    """Give rebuilt per-device optimizers the state ``held_states`` took from the former ones,
    without copies (an 11.5M-parameter Adam's on 2 devices: 1.5 ms, against 240 ms through
    ``state_dict``): a device's own where it updates the same parameter as before, else the
    former owner's (kvstore "device": ownership may move), moved to its device (Adam's
    ``step`` stays where torch keeps it)."""
    for i, optimizer in enumerate(optimizers):
        index = {id(p): kept[k] for k, p in enumerate(groups[i])}
        wrapped = _wrapped(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                j = index.get(id(p))
                if j in held[i]:
                    _place(optimizer, p, held[i][j], wrapped)
                    continue
                source = next((h[j] for h in held if j in h), None)
                if source is not None:
                    moved = {k: v.to(p.device) if isinstance(v, torch.Tensor) and not
                             (k == "step" or k.endswith("/step")) else v for k, v in source.items()}
                    _place(optimizer, p, moved, wrapped)


# -- the user's own optimizer object ------------------------------------------------------
def lend(user: torch.optim.Optimizer, new: Sequence[int], optimizers: Sequence[torch.optim.Optimizer],
         groups: Sequence[Sequence[torch.Tensor]], replicated: "ReplicatedOptimizer") -> None:
    """Load into ``optimizers`` (over ``groups``) the state the user's optimizer object holds
    for the parameters ``new`` (indices among ``groups[0]``), and take it out of the object:
    lent to the run, held once, not twice (``into_user_optimizer`` gives it back)."""
    if not user.state and not any(inner.state for _, inner in _wrapped(user)):     # (a Lookahead's is its base's)
        return
    lent = state_of_user_optimizer(user, [groups[0][k] for k in new], replicated)["state"]
    if lent:
        state = {"optimizer": replicated.label, "state": {new[k]: s for k, s in lent.items()},
                 "shapes": [list(p.shape) for p in groups[0]]}
        load_optimizer_state(state, optimizers, groups)
        for k in new:
            for holder in [user] + [inner for _, inner in _wrapped(user)]:
                holder.state.pop(groups[0][k], None)



def state_of_user_optimizer(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                            replicated: "ReplicatedOptimizer") -> Dict[str, Any]:
    """The state an optimizer the user built on the model holds (a second ``fit`` with it, or
    one trained before), as ``optimizer_state`` lays it out: ``params``, the trainable ones."""
    wrapped = _wrapped(optimizer)
    held = {j: state_of(optimizer, p, wrapped) for j, p in enumerate(params)}
    return {"optimizer": replicated.label, "shapes": [list(p.shape) for p in params],
            "state": {j: s for j, s in held.items() if s is not None},
            "groups": replicated.state_dict()["param_groups"]}


def into_user_optimizer(state: Mapping[str, Any], optimizer: torch.optim.Optimizer,
                        params: Sequence[torch.Tensor]) -> None:
    """Write what ``optimizer_state`` gave into the optimizer the user built on the model:
    each trained parameter's state (moved by torch to where the parameter is; not copied, so
    only as the run's optimizers end) and every group's hyper-parameters (learning rates a
    scheduler set), so it goes on from there."""
    wrapped = _wrapped(optimizer)       # (a wrapper's state_dict may be the wrapped one's, or need hooks it lacks)
    own = [dict(g) for g in optimizer.param_groups] if wrapped else optimizer.state_dict()["param_groups"]
    kept = {position: state_of(optimizer, p, wrapped) for position, p in
            enumerate(p for group in optimizer.param_groups for p in group["params"])}
    mine = {**{k: s for k, s in kept.items() if s is not None},       # (what the run did not train stays)
            **_by_position(optimizer, params, state["state"], copy=False)}
    groups = [{**ours, **{k: v for k, v in theirs.items() if k != "params"}}
              for ours, theirs in zip(own, state["groups"])]
    loaded(optimizer, mine, groups)
    _set_attributes(optimizer, state.get("attributes", {}))


def _set_attributes(optimizer: torch.optim.Optimizer, attributes: Mapping[str, Any]) -> None:
    """The plain attributes an optimizer's steps reached (``attributes_of``: a step counter)."""
    for key, value in attributes.items():
        setattr(optimizer, key, copy.deepcopy(value))


# -- an optimizer wrapping another (SAM) --------------------------------------------------
def _wrapped(optimizer: torch.optim.Optimizer) -> List[Tuple[str, torch.optim.Optimizer]]:
    """The optimizers ``optimizer`` keeps as attributes (SAM's ``base_optimizer``)."""
    return [(k, v) for k, v in vars(optimizer).items() if isinstance(v, torch.optim.Optimizer) and v is not optimizer]


def state_of(optimizer: torch.optim.Optimizer, p: torch.Tensor,
             wrapped: Sequence[Tuple[str, torch.optim.Optimizer]] = ()) -> Optional[Dict[str, Any]]:
    """Parameter ``p``'s state in ``optimizer`` and those it wraps (keys ``"<attribute>/<key>"``),
    or None if none holds any."""
    own = p in optimizer.state and not any(inner.state is optimizer.state for _, inner in wrapped)
    held = dict(optimizer.state[p]) if own else None
    for name, inner in wrapped:
        if p in inner.state:
            held = held or {}
            held.update({f"{name}/{k}": v for k, v in inner.state[p].items()})
    return held


def _place(optimizer: torch.optim.Optimizer, p: torch.Tensor, held: Dict[str, Any],
           wrapped: Sequence[Tuple[str, torch.optim.Optimizer]]) -> None:
    """``held`` (``state_of``'s keys) as parameter ``p``'s state in ``optimizer`` and those it wraps."""
    if not wrapped:
        optimizer.state[p] = held
        return
    for holder, part in _split(optimizer, held, wrapped):
        if part:
            holder.state[p] = part


def _split(optimizer: torch.optim.Optimizer, held: Mapping[str, Any],
           wrapped: Sequence[Tuple[str, torch.optim.Optimizer]]) -> List[Tuple[torch.optim.Optimizer, Dict[str, Any]]]:
    """``held`` (``state_of``'s keys) cut into each holder's own keys: ``optimizer``'s first,
    then each wrapped one's (its ``"<attribute>/"`` prefix taken off)."""
    prefixes = tuple(f"{name}/" for name, _ in wrapped)
    parts = [(optimizer, {k: v for k, v in held.items() if not k.startswith(prefixes)})]
    for prefix, (_, inner) in zip(prefixes, wrapped):
        parts.append((inner, {k[len(prefix):]: v for k, v in held.items() if k.startswith(prefix)}))
    return parts


def loaded(optimizer: torch.optim.Optimizer, by_position: Dict[int, Dict[str, Any]],
           groups: Optional[List[Dict[str, Any]]] = None) -> None:
    """Load ``by_position`` (torch's layout, ``state_of``'s keys) into ``optimizer`` and those it
    wraps, with ``groups`` (default: its own) as hyper-parameters; a wrapped optimizer that shared
    its groups goes on sharing them (torch's load makes new ones)."""
    wrapped = _wrapped(optimizer)
    shared = [inner for _, inner in wrapped if inner.param_groups is optimizer.param_groups]
    same_state = [inner for _, inner in wrapped if inner.state is optimizer.state]
    split = {k: _split(optimizer, s, wrapped) for k, s in by_position.items()}
    if groups is None:          # (a wrapper's state_dict may be the wrapped one's, or need hooks it lacks)
        groups = [dict(g) for g in optimizer.param_groups] if wrapped else optimizer.state_dict()["param_groups"]
    for h, holder in enumerate([optimizer] + [inner for _, inner in wrapped]):
        own = {k: parts[h][1] for k, parts in split.items() if parts[h][1]}
        if h == 0 and wrapped:          # (a wrapper's load_state_dict may load the wrapped one's: a Lookahead's)
            _load_own(optimizer, own, groups)
        else:
            holder.load_state_dict({"state": own, "param_groups": groups if h == 0 else
                                    holder.state_dict()["param_groups"]})
        if holder in shared:
            holder.param_groups = optimizer.param_groups
        if holder in same_state:        # (a wrapper whose state is the wrapped one's goes on so)
            optimizer.state = holder.state


def _load_own(optimizer: torch.optim.Optimizer, by_position: Dict[int, Dict[str, Any]],
              groups: List[Dict[str, Any]]) -> None:
    """``by_position`` as the state of ``optimizer`` itself and ``groups``' hyper-parameters in
    its groups, as torch's ``load_state_dict`` would (values on their parameter's device, floats
    in its dtype, ``step`` as it is), without calling it: a wrapper's may do something else."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: Dict[torch.Tensor, Dict[str, Any]] = collections.defaultdict(dict)
    for k, held in by_position.items():
        p = params[k]
        state[p] = {key: v.to(p.device, p.dtype if v.is_floating_point() else v.dtype)
                    if isinstance(v, torch.Tensor) and key != "step" else v for key, v in held.items()}
    optimizer.state = state
    for group, saved in zip(optimizer.param_groups, groups):
        group.update({k: v for k, v in saved.items() if k != "params"})
