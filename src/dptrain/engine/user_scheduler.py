"""A scheduler the user built on the optimizer given to ``fit``, as Accelerate's ``prepare`` and
Lightning's ``configure_optimizers`` take one (``get_linear_schedule_with_warmup(optimizer, ...)``).

``fit`` trains with one optimizer per device, whose hyper-parameters a ``ReplicatedOptimizer``
holds (built from the user's groups: their ``lr`` and ``initial_lr`` as the scheduler left
them). The scheduler is lent to it for the run, so that its steps set the learning rates that
train, and handed back to the user's optimizer at the end, which then holds the learning
rates and state training reached: the scheduler goes on from there in a loop of one's own or
a second ``fit``, as it would after a plain loop.

>>> lent = LentScheduler(scheduler, optimizer)    # scheduler.optimizer is optimizer
>>> lent(replicated)          # fit's make_scheduler: the same object, stepping replicated's groups
>>> lent.give_back()          # after the run: bound to the user's optimizer again
"""
from __future__ import annotations

from typing import Any

import torch


def built_on(scheduler: Any, optimizer: Any) -> bool:
    """Whether ``scheduler`` is an object (not a factory) made on the optimizer ``optimizer``."""
    return (not callable(scheduler) and isinstance(optimizer, torch.optim.Optimizer)
            and getattr(scheduler, "optimizer", None) is optimizer)


class LentScheduler:
    """A factory ``fn(optimizer) -> scheduler`` that lends the user's scheduler object."""

    def __init__(self, scheduler: Any, optimizer: torch.optim.Optimizer):
        self.scheduler, self.home = scheduler, optimizer

    def __call__(self, optimizer: torch.optim.Optimizer) -> Any:
        if len(optimizer.param_groups) != len(self.home.param_groups):
            raise ValueError(f"the scheduler was built on an optimizer of {len(self.home.param_groups)} parameter "
                             f"groups, and training has {len(optimizer.param_groups)}: give scheduler=lambda "
                             f"optimizer: ... instead")
        self.scheduler.optimizer = optimizer
        return self.scheduler

    def give_back(self) -> None:
        self.scheduler.optimizer = self.home
