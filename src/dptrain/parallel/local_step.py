"""The update of one device in one process: the gradients backward left are already the step's.

With nothing to sum (one device, one process, a mean loss: ``Trainer.alone``) an update is a
plain loop's ``optimizer.step(); optimizer.zero_grad()``, with what ``Trainer.step`` adds on
top done in place on ``p.grad``: the float16 loss scale divided out, the NaN check, the
report's copies, clipping by norm and by value. No copy and no bucket: a tiny MLP's step costs
what the plain loop's does (benchmarks/RESULTS.md, issue 22).

>>> stepped, norm = local_step(params, optimizer, replicated, device, report, max_norm=1.0)
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from . import bare_step
from .replicated_optimizer import ReplicatedOptimizer
from .sync.grad_ops import clamp_, grad_norm, scale_and_clip_, unscale_and_check_
from .update_report import UpdateReport


def local_step(params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer, replicated: ReplicatedOptimizer,
               origins: Sequence[int], device: torch.device, report: UpdateReport, skip_nonfinite: bool = False,
               max_norm: Optional[float] = None, max_value: Optional[float] = None,
               loss_scale: Optional[float] = None) -> Tuple[bool, Optional[torch.Tensor]]:
    """Update ``params`` (the one device's trainable parameters, in the report's index order)
    with ``optimizer`` on their gradients as they are; returns whether it updated and the norm
    before clipping (with ``max_norm``). A skipped update (a NaN or infinite gradient, with
    ``skip_nonfinite`` or ``loss_scale``) clears the gradients and updates nothing."""
    report.clear()
    if loss_scale is not None:      # divided out and checked in one pass, as GradScaler does
        skip_nonfinite = unscale_and_check_(params, loss_scale)
    elif skip_nonfinite:
        skip_nonfinite = unscale_and_check_(params, 1.0)
    if skip_nonfinite:
        for p in params:
            p.grad = None
        return False, None
    replicated.push(((optimizer, origins),))
    norm = None
    if report.keep_grads or max_norm is not None or max_value is not None:
        held = [j for j, p in enumerate(params) if p.grad is not None]
        grads = [params[j].grad for j in held]
        step = report.request()
        step.keep(held, grads)              # copies, before clipping changes them
        if max_norm is not None:
            norm = scale_and_clip_(grads, None, max_norm, grad_norm(grads, device, step, held))
        clamp_(grads, max_value)
        report.read(step)
    bare_step.step(optimizer)
    bare_step.zero_grad(optimizer)
    replicated.step()       # marks the step for lr schedulers
    return True, norm
