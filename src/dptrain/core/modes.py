"""A model in eval mode for a while, then every module's own mode back.

``model.train(was)`` after an evaluation sets every submodule to the model's mode: a BatchNorm
the user froze (``model.bn.eval()`` in a fine-tuning script or a callback) trained again from
the next epoch on, silently. ``evaluating`` keeps each module's flag and puts it back.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def evaluating(*models: nn.Module) -> Iterator[None]:
    """Every module of ``models`` in eval mode inside the block; after it, each module's mode
    as it was, module by module.

    >>> with evaluating(model):
    ...     loss = model(x)         # dropout off, BatchNorm on its running statistics
    """
    saved = [[(m, m.training) for m in model.modules()] for model in models]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for modes in saved:
            for m, mode in modes:
                m.training = mode
