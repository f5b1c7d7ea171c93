"""What a ``LightningModule`` reads from its ``Trainer`` while ``fit`` trains it: a stand-in set
as its ``trainer`` for the run (Lightning's ``self.current_epoch`` and ``self.global_step``
read 0 without one, silently).

    stand_in = TrainerStandIn(max_epochs=10, max_steps=None)
    attach(model, stand_in)          # model.trainer is it; model.current_epoch reads it
    stand_in.at(epoch=2, step=340)   # the loop, before each batch: the epoch (from 0), updates done
    detach(model)                    # after the run: model.trainer is None again

It holds ``current_epoch`` (from 0), ``global_step`` (the updates done before the batch; after
an epoch, all of its), ``max_epochs``, ``max_steps`` (-1 without), ``world_size``,
``global_rank``, ``local_rank``, ``is_global_zero``, ``accumulate_grad_batches``, ``datamodule``
(the one given to fit, else None), ``logger`` and ``progress_bar_callback`` None (``self.print``
prints on rank 0), and ``estimated_stepping_batches``: the updates of the run (epochs x an
epoch's batches over ``accumulate_grad_batches``, or ``max_steps`` if fewer), counted once the
training data is loaded. A ``configure_optimizers`` that reads it (``OneCycleLR(total_steps=...)``) is called
then (``LateConfigure``, resolved by the run: ``Task.configure_later``), not when fit starts.
Anything else of Lightning's ``Trainer`` (its loops, callbacks) is an ``AttributeError`` naming
the fix. Every device's copy of the module shares it (``LightningSteps`` sets it on the copy it
calls: Lightning's ``__getstate__`` leaves a copy's trainer out).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

from ..distributed.env import DistEnv

#: What the stand-in counts once the training data is loaded.
UPDATES = "estimated_stepping_batches"


class TrainerStandIn:
    """See the module docstring."""

    logger = None
    loggers = ()
    progress_bar_callback = None        # (Lightning's self.print then prints, on rank 0)
    sanity_checking = False
    #: Lightning's ``self.log`` outside the steps (which record it) then warns and does nothing.
    barebones = True

    def __init__(self, max_epochs: int, max_steps: Optional[int], accumulate_grad_batches: int = 1,
                 datamodule: Any = None):
        env = DistEnv.current()
        self.accumulate_grad_batches, self.datamodule = accumulate_grad_batches, datamodule
        self.current_epoch, self.global_step = 0, 0
        self.max_epochs, self.max_steps = max_epochs, max_steps if max_steps is not None else -1
        self.world_size, self.global_rank, self.local_rank = env.world_size, env.rank, env.local_rank
        self.is_global_zero = env.rank == 0
        self.updates_asked = False      # estimated_stepping_batches was read before it was counted

    def at(self, epoch: int, step: int) -> None:
        self.current_epoch, self.global_step = epoch, step

    def __deepcopy__(self, memo: Any) -> "TrainerStandIn":
        return self                 # (one for every copy of the module)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == UPDATES:
            self.updates_asked = True
            raise AttributeError(f"model.trainer.{UPDATES} is counted once the training data is loaded: read it in "
                                 f"configure_optimizers (called then) or a training step, not before fit")
        raise AttributeError(f"model.trainer.{name}: while fit trains a LightningModule, its trainer is dptrain's "
                             f"stand-in, which holds current_epoch, global_step, max_epochs, max_steps, world_size, "
                             f"global_rank, local_rank, is_global_zero, accumulate_grad_batches, datamodule and "
                             f"{UPDATES}, not {name}: read what you need "
                             f"from the run in a dptrain.Callback (run.epoch, run.step...) and set it on run.model, "
                             f"which every device's copy then has")


class LateConfigure:
    """A module's ``configure_optimizers`` that reads ``estimated_stepping_batches``, as fit's
    optimizer: called with the run's updates once they are counted."""

    def __init__(self, configure: Callable[[], Any], stand_in: TrainerStandIn):
        self.configure, self.stand_in = configure, stand_in

    def __call__(self, updates: int) -> Any:
        self.stand_in.estimated_stepping_batches = updates
        return self.configure()

    def __repr__(self) -> str:
        return "model.configure_optimizers (once the updates are counted)"


def attach(model: nn.Module, stand_in: TrainerStandIn) -> bool:
    """Set ``stand_in`` as the trainer of a LightningModule that has none (its ``_trainer``
    None); whether it was set."""
    if "_trainer" not in vars(model) or model._trainer is not None:
        return False
    model.__dict__["_trainer"] = stand_in
    return True


def detach(model: nn.Module) -> None:
    """The module's trainer is None again, if it was a stand-in."""
    if isinstance(vars(model).get("_trainer"), TrainerStandIn):
        model.__dict__["_trainer"] = None
