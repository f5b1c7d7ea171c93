"""The optimizer the user and the schedulers hold while per-device optimizers do the updates.

A ``Trainer`` runs one optimizer per device (``optim.py``'s ``OptimizerPlan`` builds them);
``ReplicatedOptimizer`` is the one object over them all: its groups carry the hyper-parameters
(a scheduler's learning rate) to theirs before each step (``push``), and take back the values
their steps changed in the groups, for optimizers that keep some there (``pulled``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .combined import CombinedOptimizer
from .optim import OptimizerPlan


class ReplicatedOptimizer(torch.optim.Optimizer):
    """The optimizer as the user sees it: the groups and hyper-parameters of every replica's.

    ``trainer.optimizer`` is one: attach a ``torch.optim.lr_scheduler`` to it, or change a
    group's ``lr``; the ``Trainer`` hands the hyper-parameters on to the per-device optimizers
    before each step. Its own ``step()`` updates nothing (``Trainer.step`` does); the Trainer
    calls it after each update, so schedulers see the usual optimizer-then-scheduler order.
    Its groups hold replica 0's parameters, frozen ones too where the user's optimizer did;
    in ``fit``, ``add_param_group`` takes a group between steps (a layer unfrozen: ``layout.py``).

    >>> scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(trainer.optimizer, T_max=100)
    """

    def __init__(self, plan: OptimizerPlan, params: Sequence[torch.Tensor],
                 replicas: Sequence[Sequence[torch.Tensor]]):
        groups = [{"params": [params[j] for j in members], **hyper} for members, hyper in plan.groups]
        super().__init__(groups, plan.defaults)
        self.label = plan.label
        self._replicas = replicas
        #: Whether ``add_param_group`` may add groups between steps (``fit``'s Trainer follows
        #: them: ``Trainer.follow``); ``group_added``: one was added since the Trainer last looked.
        self.growable, self.group_added = False, False
        self._built = True
        #: Per-device optimizers (and their groups' origins) whose steps may change their groups'
        #: values (a Lookahead's step counter: not torch.optim's): ``step`` takes them back, or
        #: ``push`` would set them back before every step.
        self.pulled: Sequence[Tuple[torch.optim.Optimizer, List[int]]] = ()
        #: The step post-hooks of the optimizer objects the user built (``register_step_post_hook``),
        #: which the per-device optimizers built again do not have: ``step`` runs them (``_hooked``),
        #: given this optimizer (part name None) or a combined optimizer's part.
        self.user_hooks: List[Tuple[Optional[str], Mapping[Any, Callable[..., Any]]]] = []
        made = getattr(plan, "made_parts", None)        # a CombinedPlan's: each optimizer's groups
        self._parts: Dict[str, Any] = {} if made is None else made(self)

    @property
    def parts(self) -> Dict[str, Any]:
        """A combined optimizer's parts, by name (``OptimizerPart``: one's groups, for a
        scheduler of its own); empty for one optimizer."""
        return dict(self._parts)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:   # noqa: D102 - see growable
        if not getattr(self, "_built", False):
            super().add_param_group(param_group)
            return
        if not self.growable:
            raise ValueError("add_param_group on the optimizer of a Trainer in your own loop: its per-device "
                             "optimizers are built for the parameters that train when it is set up, and a group "
                             "added now would never be updated; set requires_grad, then replicate the model again "
                             "and make a new Trainer (fit takes new groups between steps)")
        try:
            super().add_param_group(param_group)
        except ValueError as e:
            if "more than one parameter group" not in str(e):
                raise
            raise ValueError("add_param_group: some of these parameters are in a group of the optimizer already "
                             "(one built on model.parameters() holds the frozen ones too, and they train in it once "
                             "requires_grad is set): add only parameters no group holds, or build the optimizer "
                             "on the parameters that train at the start (filter by requires_grad)") from None
        self.group_added = True

    def set_groups(self, members: Sequence[Sequence[int]], params: Sequence[torch.Tensor],
                   hyper: Sequence[Dict[str, Any]]) -> None:
        """The groups a checkpoint had (``members``: indices in ``params``; ``hyper``, from its
        ``state_dict``, for groups added since this was made)."""
        for g, group_members in enumerate(members):
            chosen = [params[j] for j in group_members]
            if g < len(self.param_groups):
                self.param_groups[g]["params"] = chosen
            else:
                self.param_groups.append({**{k: v for k, v in hyper[g].items() if k != "params"}, "params": chosen})

    def step(self, closure=None):   # noqa: D102 - see the class docstring
        self.mark()
        self.pull()
        for part in self._parts.values():       # (their schedulers see them stepped)
            part.step()
        if self._optimizer_step_post_hooks or self._optimizer_step_pre_hooks or any(h for _, h in self.user_hooks):
            self._hooked()
        return None

    def mark(self) -> None:
        """An update was made: what torch's schedulers check (torch < 2.4: the count)."""
        self._opt_called = True
        self._step_count = getattr(self, "_step_count", 0) + 1

    def pull(self) -> None:
        """The groups' values an optimizer of another kind changed in its step (``pulled``:
        Prodigy's ``d``), taken from the per-device optimizers."""
        for optimizer, origin in self.pulled:
            for group, g in zip(optimizer.param_groups, origin):
                mine = self.param_groups[g]
                params = mine["params"]
                mine.update(group)
                mine["params"] = params

    def _hooked(self) -> None:
        """After an update, as torch's ``step`` would: the step post-hooks (the user's optimizer
        object's, then this one's), given this optimizer; the first replica's parameters, which they
        may have written (a max-norm constraint, ``p.data`` too), are then copied to the others."""
        if self._optimizer_step_pre_hooks:
            raise ValueError(pre_hook_error("run.optimizer"))
        for part, hooks in [*self.user_hooks, (None, self._optimizer_step_post_hooks)]:
            for hook in list(hooks.values()):
                hook(self if part is None else self._parts[part], (), {})
        first, *others = self._replicas
        with torch.no_grad():
            for params in others:
                for p, q in zip(params, first):
                    p.copy_(q, non_blocking=True)
    # Marked as already hooked, so torch.optim does not wrap it in a profiler record per call
    # (14 us a step for a call that does nothing); and as tracked for lr schedulers, which then
    # need not wrap it either: one built on the user's optimizer and lent to this one
    # (engine/user_scheduler.py) would otherwise warn that step was replaced.
    step.hooked = True
    step._wrapped_by_lr_sched = step._with_counter = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self._replicas:
            for p in group:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def push(self, optimizers: Sequence[Tuple[torch.optim.Optimizer, List[int]]]) -> None:
        """Give each per-device optimizer's groups the hyper-parameters of the groups they came from."""
        for optimizer, origin in optimizers:
            for group, g in zip(optimizer.param_groups, origin):
                params = group["params"]
                group.update(self.param_groups[g])      # one call in C (a loop over keys took 5 us a step)
                group["params"] = params


def pre_hook_error(where: str) -> str:
    """Why a step pre-hook cannot run (``register_step_pre_hook`` on ``where``), and what to do."""
    return (f"{where} has a step pre-hook (register_step_pre_hook): it would run before each update on the "
            f"gradients summed over the devices and processes, which exist only inside dptrain's step. Register it "
            f"with register_step_post_hook (run once after each update, given run.optimizer; what it writes on "
            f"the weights reaches every device), or use clip_grad_norm= / clip_grad_value= for clipping")


def step_hooks(spec: Any) -> List[Tuple[Optional[str], Dict[Any, Any]]]:
    """The step post-hooks of the optimizer object(s) the user built, for ``ReplicatedOptimizer``
    to run: ``(None, hooks)``, or a combined optimizer's ``(part name, hooks)`` (the dicts
    themselves: hooks registered later count). A ValueError for a pre-hook."""
    parts = spec.optimizers.items() if isinstance(spec, CombinedOptimizer) else \
        [(None, spec)] if isinstance(spec, torch.optim.Optimizer) else []
    hooks = []
    for name, optimizer in parts:
        if getattr(optimizer, "_optimizer_step_pre_hooks", None):
            raise ValueError(pre_hook_error(f"the optimizer {type(optimizer).__name__}" +
                                            (f" ({name!r})" if name is not None else "")))
        post = getattr(optimizer, "_optimizer_step_post_hooks", None)
        if post is not None:
            hooks.append((name, post))
    return hooks
