"""Which parameters can train is settled when training starts; one frozen then stays frozen.

A ``Trainer``'s gradient buckets and per-device optimizers are built for the parameters that
have ``requires_grad`` when it is set up. A callback that unfreezes a backbone mid-run
(Lightning's ``BackboneFinetuning``) would be silently ignored, so ``Trainer.step`` and ``fit``
(after each hook that runs user code before a step) check the set against the one they
started with, and stop with the parameters named and the way to do it: phases, one ``fit``
(or ``Trainer``) each. ``fit`` lets a parameter that trained at the start stop and start
again (``freezing``): ``model_edits.py`` freezes it on every replica, and a parameter no
device computes a gradient for is not updated, as in the plain loop. A ``Trainer`` of the
user's own loop, whose replicas the user holds, refuses any change.
"""
from __future__ import annotations

from typing import List

from torch import nn

#: How to change what ``fit`` trains: said in its error about it.
PHASES = ("train in phases instead, one fit call each: fit with them frozen, then set requires_grad and call fit "
          "again with an optimizer over the parameters to train (Keras's fine-tuning: trainable, then compile "
          "and fit again)")
#: The same for a ``Trainer`` of the user's own loop.
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

    def check(self, where: str, fix: str = PHASES, freezing: bool = False) -> bool:
        """Raise a ValueError naming the parameters whose ``requires_grad`` changed (by ``where``),
        and ``fix``. With ``freezing``, a parameter that trained at the start may stop (and
        start again): returns whether the set changed since the last check, for the caller
        to make the other replicas follow; one frozen at the start may not start."""
        now = [p.requires_grad for p in self._params]
        if now == self._now:
            return False
        thawed = [n for (n, p), was in zip(self._named, self._mask) if p.requires_grad and not was]
        if freezing and not thawed:
            self._now = now
            return True
        frozen = [n for (n, p), was in zip(self._named, self._mask) if was and not p.requires_grad]
        said = "; ".join(f"{what}: {_names(names)}" for what, names in
                         (("now trains", thawed), ("now frozen", [] if freezing else frozen)) if names)
        raise ValueError(f"requires_grad changed during training, {where} ({said}): the devices' copies, the "
                         f"gradient exchange and the optimizer are set up for the parameters that train when "
                         f"training starts, and this change would not be trained as asked; {fix}")


def _names(names: List[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
