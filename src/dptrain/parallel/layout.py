"""What a ``Trainer`` trains, and the optimizers that update it: a ``Layout``.

Made when the Trainer is set up, and built again when a callback of ``fit`` unfreezes a layer
or adds a group to ``run.optimizer`` (``Trainer.follow``). It holds:

- ``params``: replica 0's parameters, frozen ones included. The optimizer's ``plan`` names its
  groups' members by their index here, so an optimizer built on ``model.parameters()`` keeps
  its frozen ones, which train once unfrozen;
- ``kept``: the indices that train now (``requires_grad``, and in a group); ``groups[i]``:
  device ``i``'s parameters at those indices; ``frozen``: replica 0's others (several
  processes start from rank 0's);
- ``optimizers[i]``: device ``i``'s optimizer, over the parameters it updates (all of
  ``groups[i]``, or those it owns), and ``origins[i]``: the plan group each of its groups is;
- ``optimizer``: the ``ReplicatedOptimizer`` the user and the schedulers hold, one object for
  the whole run.

A rebuild keeps every optimizer state, moved without copies (``optim_state.carry_states``).
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Dict, List, Optional, Sequence

import torch

from ..core.runner import DeviceRunner
from ..distributed.collective import Collective
from .optim import OptimizerPlan, OptimizerSpec
from .replicated_optimizer import ReplicatedOptimizer, step_hooks
from .step_traits import custom
from .optim_state import carry_states, held_states, into_user_optimizer, lend
from .replicas import Replicas
from .sync import GradientSync
from .sync.sparse import sparse_parameters
from .trainable import TrainableSet, check_thawed, kept


class Layout:
    """See the module docstring.

    >>> layout = Layout(replicas, None, [], torch.optim.AdamW, None)
    >>> layout.build(sync)                    # the sync set up, the per-device optimizers made
    >>> plan = layout.regrouped(True)         # after a callback: None, or the plan to rebuild for
    """

    def __init__(self, replicas: Optional[Replicas], given: Optional[List[List[torch.Tensor]]],
                 frozen: List[torch.Tensor], spec: OptimizerSpec, optimizer_params: Optional[Dict[str, Any]]):
        self.replicas, self.spec = replicas, spec
        if replicas is not None:
            self.params = list(replicas[0].parameters())
            trainable = [p for p in self.params if p.requires_grad]
            if not trainable:
                raise ValueError("the model has no trainable parameter (every one has requires_grad=False)")
            self.groups: List[List[torch.Tensor]] = []
        else:           # parameter lists, one per device (the from-scratch layout): all of them train
            self.params = trainable = given[0]
            self.groups = given
        self.frozen = frozen
        self.plan = OptimizerPlan.resolve(spec, optimizer_params, trainable, self.params)
        self.optimizer = ReplicatedOptimizer(self.plan, self.params, [])
        self.hooks = step_hooks(self.plan.source)       # (of the object given, or a factory made)
        # Listed once: walking the modules for them took ~80 us a step.
        self.buffers = list(replicas[0].buffers()) if replicas is not None else []
        self.kept: List[int] = []
        self.mask: List[bool] = []
        self.optimizers: List[torch.optim.Optimizer] = []
        self.origins: List[List[int]] = []
        self.trainable: Optional[TrainableSet] = None

    def build(self, sync: GradientSync) -> None:
        """Set ``sync`` up for what trains now, and make the per-device optimizers."""
        self.kept = kept(self.params, self.plan)
        if self.replicas is not None:
            every = [list(m.parameters()) for m in self.replicas]
            self.groups = [[ps[j] for j in self.kept] for ps in every]
            chosen = set(self.kept)
            self.frozen = [p for j, p in enumerate(self.params) if j not in chosen]
        elif len(self.kept) < len(self.groups[0]):        # trainable, but not given to the optimizer
            self.groups = [[g[j] for j in self.kept] for g in self.groups]
        plan = self.plan.restricted(self.kept)
        if self.replicas is not None:
            sync.sparse = sparse_parameters(self.replicas[0], self.groups[0])
        sync.setup(self.groups, self.frozen + self.buffers)
        self.optimizers, self.origins = [], []
        for i, g in enumerate(self.groups):
            mine = sync.optimized(i)
            indices = range(len(g)) if mine is None else mine
            optimizer, origin = plan.build([g[j] for j in indices], indices)
            self.optimizers.append(optimizer)
            self.origins.append(origin)
        self.optimizer._replicas = self.groups
        self.optimizer.pulled = list(zip(self.optimizers, self.origins)) if custom(plan) else ()
        self.optimizer.user_hooks = self.hooks
        self.trainable = TrainableSet(self.replicas[0]) if self.replicas is not None else None
        self.mask = [p.requires_grad for p in self.params]

    def broadcast_buffers(self, runner: DeviceRunner, collective: Collective) -> None:
        """Every replica's buffers (running statistics) set to device 0's of rank 0, as
        DistributedDataParallel does after each step, so that every replica evaluates the same model."""
        if self.replicas is None or not self.buffers:
            return
        several = len(self.replicas.devices) > 1
        if not several and collective.world_size == 1:
            return
        collective.broadcast_tensors(self.buffers)
        if several:
            def copy(i: int) -> None:
                if i:
                    for b, s in zip(self.replicas[i].buffers(), self.buffers):
                        b.copy_(s, non_blocking=True)
            runner.map(copy)

    def lend(self, new: Sequence[int]) -> None:
        """The state the user's optimizer object holds for the kept parameters ``new``
        (indices among ``kept``), lent to the per-device optimizers (``optim_state.lend``)."""
        if isinstance(self.spec, torch.optim.Optimizer):
            lend(self.spec, new, self.optimizers, self.groups, self.optimizer)

    def regrouped(self, trainable_changed: bool, others: Collection[int] = ()) -> Optional[OptimizerPlan]:
        """After user code ran: the plan to build again for, if a parameter now trains that the
        per-device optimizers do not hold (unfrozen, or in a group added to ``optimizer``);
        None if nothing is to be done (nothing changed, or a layer frozen: it gets no gradient,
        so it is not updated). A ValueError for a layer unfrozen that no group holds (nor,
        ``others``, another optimizer of the run)."""
        if not self.optimizers or self.replicas is None or not (trainable_changed or self.optimizer.group_added):
            return None
        plan = self.plan.regrouped(self.optimizer, self.params)
        check_thawed(list(self.replicas[0].named_parameters()), self.mask, plan, others)
        if not self.optimizer.group_added and set(kept(self.params, plan)) <= set(self.kept):
            return None
        return plan

    def rebuild(self, plan: OptimizerPlan, sync: GradientSync, carry: bool = True) -> None:
        """Build again, under ``plan``, for what trains now on replica 0 (every replica's
        ``requires_grad`` follows it; no gradient is kept), with a fresh ``sync``. ``carry``:
        the optimizer states go on (new parameters take what the user's optimizer object
        holds for them, else none, as in a plain loop)."""
        held, old = held_states(self.optimizers, self.groups, self.kept) if carry else [], set(self.kept)
        for m in self.replicas:
            for p, q in zip(m.parameters(), self.params):
                p.requires_grad_(q.requires_grad)
                p.grad = None
        self.plan, self.optimizer.group_added = plan, False
        self.build(sync)
        if carry:
            self.lend([k for k, j in enumerate(self.kept) if j not in old])
            carry_states(held, self.optimizers, self.groups, self.kept)

    def names(self) -> List[str]:
        """The name of each parameter the steps hold, by its index there: the model's
        (``named_parameters``), or ``#k`` for the ``k``-th of a parameter list."""
        if self.replicas is None:
            return [f"#{k}" for k in self.kept]
        every = [name for name, _ in self.replicas[0].named_parameters()]
        return [every[k] for k in self.kept]

    # -- checkpoints and the user's optimizer ----------------------------------------------
    def trains(self) -> Dict[str, Any]:
        """What a checkpoint keeps of the layout: which parameters train, each group's members."""
        if self.replicas is None:
            return {}
        return {"requires_grad": [p.requires_grad for p in self.params],
                "members": [members for members, _ in self.plan.groups]}

    def restore(self, state: Dict[str, Any], fresh_sync: Callable[[], GradientSync]) -> bool:
        """Before a checkpoint's optimizer state loads: what trained then (layers a callback
        unfroze, groups it added), if it differs from now; then build again (with a sync
        ``fresh_sync`` gives). Returns whether it did."""
        flags, members = state.get("requires_grad"), state.get("members")
        if self.replicas is None or flags is None or len(flags) != len(self.params) or \
                (flags == [p.requires_grad for p in self.params] and members == [m for m, _ in self.plan.groups]):
            return False
        for p, flag in zip(self.params, flags):
            p.requires_grad_(flag)
        self.optimizer.set_groups(members, self.params, state["groups"])
        self.rebuild(self.plan.regrouped(self.optimizer, self.params), fresh_sync(), carry=False)
        return True

    def give_back(self, state: Dict[str, Any]) -> None:
        """Into the optimizer object the user built on the model, if one was given: ``state``
        (``Trainer.state_dict``'s) and the groups a callback added (``into_user_optimizer``)."""
        user = self.spec
        if isinstance(user, torch.optim.Optimizer):
            for group in self.optimizer.param_groups[len(user.param_groups):]:
                user.add_param_group({**group, "params": list(group["params"])})
            into_user_optimizer(state, user, self.groups[0])
