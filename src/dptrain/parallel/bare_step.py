"""An optimizer's ``step()`` and ``zero_grad()``, without torch's per-call wrappers when nothing listens.

``torch.optim`` wraps every optimizer's ``step`` in a profiler record and a loop over its
hooks, and ``zero_grad`` in a dynamo guard and another profiler record. When no profiler
runs and no hook is registered they do nothing, yet cost about 6 us each a call on this
2-core machine: 12 us of a tiny MLP's 160 us CPU step (benchmarks/RESULTS.md, session 11).
``step`` and ``zero_grad`` here do what the optimizer's own do, the same update on the same
numbers, and call the wrapped methods whenever a profiler or a hook could see the difference
(or the optimizer's class brings its own ``zero_grad``, or its instance its own ``step``).

>>> step(optimizer); zero_grad(optimizer)      # as optimizer.step(); optimizer.zero_grad()
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.optim import Optimizer
from torch.optim import optimizer as _torch_optimizer

# The code of torch's step wrapper (``Optimizer.profile_hook_step``): only a step wrapped by it
# is unwrapped here, never a user's own decorator that happens to set ``__wrapped__``.
_WRAPPER = getattr(Optimizer, "profile_hook_step", None)
_WRAPPER_CODE = _WRAPPER(lambda self: None).__code__ if _WRAPPER is not None else None
_profiling: Callable[[], bool] = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled",
                                         lambda: True)      # unknown: always the wrapped way


def _listened(optimizer: Optimizer) -> bool:
    """Whether a profiler runs or any step hook (this optimizer's or global) is registered."""
    return bool(_profiling() or getattr(optimizer, "_optimizer_step_pre_hooks", None)
                or getattr(optimizer, "_optimizer_step_post_hooks", None)
                or getattr(_torch_optimizer, "_global_optimizer_pre_hooks", None)
                or getattr(_torch_optimizer, "_global_optimizer_post_hooks", None))


def step(optimizer: Optimizer) -> None:
    """``optimizer.step()``: the update itself when torch's wrapper around it would do nothing else."""
    own = type(optimizer).step
    inner = getattr(own, "__wrapped__", None)
    if inner is None or getattr(own, "__code__", None) is not _WRAPPER_CODE or "step" in vars(optimizer) \
            or _listened(optimizer):
        optimizer.step()
        return
    inner(optimizer)


def zero_grad(optimizer: Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=True)``: every optimized parameter's gradient set to None."""
    if type(optimizer).zero_grad is not Optimizer.zero_grad or "zero_grad" in vars(optimizer) or _profiling():
        optimizer.zero_grad(set_to_none=True)
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None
