"""Losses by name, as the optimizer is (``loss="mse"``, ``--loss mse``): torch's modules.

The names are the CLI's (``cross-entropy``, ``mse``, ``l1``, ``huber``, ``bce``, ``nll``) and
Keras's that mean the same in torch (``mean_squared_error``, ``mae``...). Keras's
cross-entropies take probabilities by default (``from_logits=False``) where torch's take
logits: ``"sparse_categorical_crossentropy"`` meant for a model ending in a softmax would
train otherwise on ``nn.CrossEntropyLoss`` and nothing would say so, so those names are an
error naming the two losses to choose between::

    loss_named("mse")                       # nn.MSELoss()
    loss_named("binary_crossentropy")       # ValueError: ... nn.BCEWithLogitsLoss() ... nn.BCELoss() ...
"""
from __future__ import annotations

import difflib
from typing import Callable, Dict

from torch import nn

#: Loss names for ``loss=`` and ``--loss`` (a ``pkg.module:name`` works too on the CLI).
LOSSES: Dict[str, Callable[[], nn.Module]] = {
    "cross-entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss, "l1": nn.L1Loss, "huber": nn.HuberLoss,
    "bce": nn.BCEWithLogitsLoss, "nll": nn.NLLLoss}

#: Keras's names of the same losses.
ALIASES = {"cross_entropy": "cross-entropy", "crossentropy": "cross-entropy", "mean_squared_error": "mse",
           "mae": "l1", "mean_absolute_error": "l1", "huber_loss": "huber", "smooth_l1": "huber"}

#: Keras's names whose meaning depends on what the model ends in (probabilities by default).
_PROBABILITIES = {
    "sparse_categorical_crossentropy": ("nn.CrossEntropyLoss() (or 'cross-entropy') for logits, a model with no "
                                        "softmax at its end", "nn.NLLLoss() on torch.log(probabilities)"),
    "categorical_crossentropy": ("nn.CrossEntropyLoss() for logits and one-hot or soft targets",
                                 "nn.NLLLoss() on torch.log(probabilities) with class-index targets"),
    "binary_crossentropy": ("nn.BCEWithLogitsLoss() (or 'bce') for logits, a model with no sigmoid at its end",
                            "nn.BCELoss() for probabilities")}


def loss_named(name: str, what: str = "loss", other: str = "a loss module or function") -> nn.Module:
    """The loss module called ``name`` (``LOSSES``, ``ALIASES``); a ``ValueError`` naming the
    choices for an unknown name (``what`` the setting's name, ``other`` what else it takes), or
    for Keras's probability cross-entropies."""
    key = ALIASES.get(name, name)
    if key in LOSSES:
        return LOSSES[key]()
    if name in _PROBABILITIES:
        logits, probabilities = _PROBABILITIES[name]
        raise ValueError(f"{what} {name!r} is Keras's, which takes probabilities unless from_logits=True, where "
                         f"torch's takes logits: give {logits}, or {probabilities}")
    near = difflib.get_close_matches(name, [*LOSSES, *ALIASES], n=1)
    raise ValueError(f"unknown {what} {name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                     + f"; choose one of {', '.join(LOSSES)}, or give {other}")
