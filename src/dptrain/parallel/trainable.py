"""What trains: the parameters with ``requires_grad`` that a group of the optimizer holds.

A ``Trainer``'s gradient buckets and per-device optimizers are built for the parameters that
train when it is set up. In ``fit``, a callback may change that between steps: a layer frozen
(no device computes its gradient, so it is not updated, as in the plain loop), or unfrozen
(Lightning's ``BackboneFinetuning``), with or without ``optimizer.add_param_group``: then
``Trainer.follow`` builds them again for what trains now (``kept``), keeping every optimizer
state. A layer unfrozen that no group holds would not train: an error (``check_thawed``), as
is a change some processes made and others did not (``agree``). A ``Trainer`` of the user's
own loop, whose replicas the user holds (and may have run backward on already), refuses any
change (``TrainableSet.check``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection, List, Sequence, Tuple

import torch
from torch import nn

if TYPE_CHECKING:
    from ..distributed.collective import Collective
    from .optim import OptimizerPlan

#: How to change what a ``Trainer`` of the user's own loop trains: said in its error about it.
NEW_TRAINER = ("train in phases instead: set requires_grad, then replicate the model again and make a new Trainer "
               "for the parameters to train")


class TrainableSet:
    """The model's parameters that train, as they were when this was made.

    >>> trainable = TrainableSet(model)
    >>> trainable.check("on_epoch_start")       # a ValueError if a requires_grad changed since
    """

    def __init__(self, model: nn.Module):
        self._named = list(model.named_parameters())
        self._params = [p for _, p in self._named]
        self._mask = [p.requires_grad for p in self._params]
        self._now = list(self._mask)

    def check(self, where: str, fix: str = NEW_TRAINER) -> None:
        """Raise a ValueError naming the parameters whose ``requires_grad`` changed since this
        was made (by ``where``), and ``fix``."""
        if not self.changed():
            return
        thawed = [n for (n, p), was in zip(self._named, self._mask) if p.requires_grad and not was]
        frozen = [n for (n, p), was in zip(self._named, self._mask) if was and not p.requires_grad]
        said = "; ".join(f"{what}: {_names(names)}" for what, names in
                         (("now trains", thawed), ("now frozen", frozen)) if names)
        raise ValueError(f"requires_grad changed during training, {where} ({said}): the devices' copies, the "
                         f"gradient exchange and the optimizer are set up for the parameters that train when "
                         f"training starts, and this change would not be trained as asked; {fix}")

    def changed(self) -> bool:
        """Whether a ``requires_grad`` changed since the last look (a few us: one read a parameter)."""
        now = [p.requires_grad for p in self._params]
        if now == self._now:
            return False
        self._now = now
        return True


def kept(params: Sequence[torch.Tensor], plan: "OptimizerPlan") -> List[int]:
    """Indices of the parameters that train: ``requires_grad``, and in a group of ``plan``."""
    managed = set(plan.managed())
    return [j for j, p in enumerate(params) if p.requires_grad and j in managed]


def check_thawed(named: Sequence[Tuple[str, torch.Tensor]], was: Sequence[bool], plan: "OptimizerPlan",
                 others: Collection[int] = ()) -> None:
    """A ValueError if a parameter frozen before (``was``) now has ``requires_grad`` but no
    group of the optimizer holds it: it would compute a gradient and never train. ``others``:
    parameters (by index) another optimizer of the run updates (several taking turns)."""
    managed = set(plan.managed()) | set(others)
    lost = [n for j, ((n, p), w) in enumerate(zip(named, was)) if p.requires_grad and not w and j not in managed]
    if lost:
        raise ValueError(f"requires_grad was set on {_names(lost)}, but no group of the optimizer holds them, so "
                         f"they would not train (the optimizer was built on the parameters that trained when fit "
                         f"started): add them in the same hook with run.optimizer.add_param_group({{'params': "
                         f"[...], 'lr': ...}}) (as Lightning's BackboneFinetuning does), or give fit an optimizer "
                         f"built on model.parameters(), frozen ones included: they then train once unfrozen")


def agree(collective: "Collective", flags: List[bool], plan: "OptimizerPlan") -> None:
    """Several processes: a ValueError on every one unless all train the same parameters in
    the same optimizer groups (their gradients are summed bucket by bucket)."""
    if collective.world_size == 1:
        return
    every = collective.all_gather_object((flags, [members for members, _ in plan.groups]))
    for r, (theirs, groups) in enumerate(every):
        if (theirs, groups) != every[0]:
            raise ValueError(f"the processes disagree on what trains: rank 0 trains {sum(every[0][0])} parameters in "
                             f"{len(every[0][1])} optimizer groups, rank {r} {sum(theirs)} in {len(groups)}; unfreeze "
                             f"layers and add groups alike on every process (callbacks run on every process: "
                             f"decide by the epoch or step, which all share)")


def _names(names: List[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
