"""An optimizer's state in one layout, whatever the devices, kvstore or processes: by the
index of each parameter among the trainable ones, with the groups' hyper-parameters.

Checkpoints save and load it (``Trainer.state_dict``), and it moves between the run's
per-device optimizers and the optimizer object the user built on the model: lent to a run
as it starts, given back as it ends (``Trainer.give_back``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

if TYPE_CHECKING:
    from .optim import ReplicatedOptimizer


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
        mine = owned(i)
        for j in (range(len(groups[i])) if mine is None else mine):
            if j not in state and groups[i][j] in opt.state:
                state[j] = dict(opt.state[groups[i][j]])
        if mine is None:        # every device holds the same full state: one is enough
            break
    return {"optimizer": type(optimizers[0]).__name__, "shapes": [list(p.shape) for p in groups[0]],
            "state": state, "groups": replicated.state_dict()["param_groups"]}


def load_optimizer_state(state: Mapping[str, Any], optimizers: Sequence[torch.optim.Optimizer],
                         groups: Sequence[Sequence[torch.Tensor]], replicated: "ReplicatedOptimizer") -> None:
    """Load what ``optimizer_state`` gave into ``optimizers`` (over ``groups``), whatever
    devices, kvstore or processes saved it; a ValueError names what does not match."""
    ours = type(optimizers[0]).__name__
    if state.get("optimizer") != ours:
        raise ValueError(f"the checkpoint's optimizer is {state.get('optimizer')!r}, this run's {ours!r}: "
                         f"resume with the same optimizer")
    shapes = [list(p.shape) for p in groups[0]]
    if state.get("shapes") != shapes:
        raise ValueError(f"the checkpoint's optimizer holds {len(state.get('shapes') or [])} parameters of other "
                         f"shapes than this model's {len(shapes)} trainable ones")
    saved = state.get("state", {})
    for i, opt in enumerate(optimizers):        # a copy each: torch's .to() may alias them
        opt.load_state_dict({"state": _by_position(opt, groups[i], saved, copy=True),
                             "param_groups": opt.state_dict()["param_groups"]})
    replicated.load_state_dict({"state": {}, "param_groups": state["groups"]})


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


# -- the user's own optimizer object ------------------------------------------------------
def state_of_user_optimizer(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                            replicated: "ReplicatedOptimizer") -> Dict[str, Any]:
    """The state an optimizer the user built on the model holds (a second ``fit`` with it, or
    one trained before), as ``optimizer_state`` lays it out: ``params``, the trainable ones."""
    index = {id(p): j for j, p in enumerate(params)}
    return {"optimizer": type(optimizer).__name__, "shapes": [list(p.shape) for p in params],
            "state": {index[id(p)]: dict(s) for p, s in optimizer.state.items() if id(p) in index},
            "groups": replicated.state_dict()["param_groups"]}


def into_user_optimizer(state: Mapping[str, Any], optimizer: torch.optim.Optimizer,
                        params: Sequence[torch.Tensor]) -> None:
    """Write what ``optimizer_state`` gave into the optimizer the user built on the model:
    each trained parameter's state (moved by torch to where the parameter is; not copied, so
    only as the run's optimizers end) and every group's hyper-parameters (learning rates a
    scheduler set), so it goes on from there."""
    own = optimizer.state_dict()        # (the state of parameters the run did not train stays)
    mine = {**own["state"], **_by_position(optimizer, params, state["state"], copy=False)}
    groups = [{**ours, **{k: v for k, v in theirs.items() if k != "params"}}
              for ours, theirs in zip(own["param_groups"], state["groups"])]
    optimizer.load_state_dict({"state": mine, "param_groups": groups})

