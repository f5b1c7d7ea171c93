"""What a user's function takes, read from its signature before it is called.

    takes(model.training_step, 2)     # True for (batch, batch_idx), False for (batch)
"""
from __future__ import annotations

import inspect
from typing import Any


def takes(fn: Any, count: int) -> bool:
    """Whether ``fn`` can be called with ``count`` positional arguments (True when its
    signature cannot be read: a builtin or a C callable)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*([None] * count))
    except TypeError:
        return False
    return True
