"""Operations on lists of gradients, each in place where its name ends in ``_`` and in as few
fused calls (``torch._foreach_*``) as torch allows: scale, norms, clip by norm or by value,
float16's unscale-and-check, and copies. Every gradient strategy (``base.py``, ``device.py``,
``processes.py``) and the one-device step (``local_step.py``) divide and clip with these,
so each gives what ``clip_grad_norm_`` and ``clip_grad_value_`` give on one device.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence

import torch


def scaled_copies(grads: List[torch.Tensor], scale) -> List[torch.Tensor]:
    """``grads`` times ``scale`` (None: 1), as new tensors. Torch 2.3's fused call takes no
    sparse tensor (``mul_``): then each alone."""
    if scale is None:
        return [g.clone() for g in grads]
    if isinstance(scale, torch.Tensor):
        scale = scale.to(grads[0].device, non_blocking=True)
    try:
        return list(torch._foreach_mul(grads, scale))
    except NotImplementedError:
        if not any(g.is_sparse for g in grads):
            raise
        return [g * scale for g in grads]


def mul_(grads: List[torch.Tensor], factor) -> None:
    """``grads`` times ``factor`` in place: one fused call. Torch 2.3 has no fused kernel for
    sparse tensors (an ``nn.Embedding(sparse=True)``'s gradient), and refuses the whole call
    before it changes any: then each is multiplied alone."""
    try:
        torch._foreach_mul_(grads, factor)
    except NotImplementedError:
        if not any(g.is_sparse for g in grads):
            raise
        for g in grads:
            g.mul_(factor)


def scale_(grads: List[torch.Tensor], scale) -> None:
    """Multiply gradients by ``scale`` in place (one fused call; nothing when None)."""
    if scale is None or not grads:
        return
    if isinstance(scale, torch.Tensor):
        scale = scale.to(grads[0].device, non_blocking=True)
    mul_(grads, scale)


def tensor_norms(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The 2-norm of each of ``grads`` (a 1-d tensor on ``device``): one fused call."""
    if not grads:
        return torch.zeros((0,), device=device)
    norms = torch._foreach_norm(list(grads), 2)
    if any(n.device != device for n in norms):
        norms = [n.to(device) for n in norms]
    return torch.stack(norms)


def grad_norm(grads: Sequence[torch.Tensor], device: torch.device,
              step: Optional[Any] = None, indices: Optional[Sequence[int]] = None, scale=None) -> torch.Tensor:
    """The 2-norm of ``grads`` together (a 0-d tensor on ``device``): the norm of each, then
    the norm of those, as ``clip_grad_norm_`` computes it. With ``step``, each one's is kept
    too (``SyncStep.keep_norms``: ``grads`` are the parameters ``indices``', to be scaled by
    ``scale``)."""
    norms = tensor_norms(grads, device)
    if step is not None:
        step.keep_norms(indices, norms, scale)
    return torch.linalg.vector_norm(norms, 2)


def clip_(grads: Sequence[torch.Tensor], norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale ``grads`` in place so that the gradient whose norm is ``norm`` (it may cover more
    than ``grads``: every owner's part) is at most ``max_norm``, as ``clip_grad_norm_`` does
    (the factor ``max_norm / (norm + 1e-6)``, at most 1); return ``norm``. No wait for the device.
    An infinite ``max_norm`` (the norm wanted, no clipping: ``log_grad_norm``) changes nothing."""
    if grads and not math.isinf(max_norm):
        factor = (max_norm / (norm + 1e-6)).clamp_(max=1.0)
        mul_(list(grads), factor if factor.device == grads[0].device else factor.to(grads[0].device))
    return norm


def scale_and_clip_(grads: Sequence[torch.Tensor], scale, max_norm: float, norm: torch.Tensor) -> torch.Tensor:
    """Divide the summed gradient (multiply by ``scale``, ``1 / denominator``; None: 1) and clip
    it to ``max_norm`` in one pass over ``grads``, not two. ``norm``: the norm of the summed,
    undivided gradient (it may cover more than ``grads``: every owner's part); the divided
    one's is ``norm * scale``, which is returned (what ``clip_grad_norm_`` reports). An
    infinite ``max_norm`` divides only (the norm wanted, no clipping: ``log_grad_norm``)."""
    factor = None
    if scale is not None:
        scale = scale.to(norm.device, norm.dtype) if isinstance(scale, torch.Tensor) else scale
        norm, factor = norm * scale, scale
    if math.isinf(max_norm):
        scale_(list(grads), factor)
        return norm
    clip = (max_norm / (norm + 1e-6)).clamp_(max=1.0)
    if grads:
        factor = clip if factor is None else clip * factor
        mul_(list(grads), factor if factor.device == grads[0].device else factor.to(grads[0].device))
    return norm


def clamp_(grads: Sequence[torch.Tensor], max_value: Optional[float]) -> None:
    """Clip every element of the final (summed, divided) gradients to ``[-max_value,
    max_value]`` in place, as ``clip_grad_value_`` does on one device (nothing when None):
    element by element, so each device or process clamping its copy gives the same step."""
    if max_value is not None and grads:
        grads = list(grads)
        torch._foreach_clamp_min_(grads, -max_value)
        torch._foreach_clamp_max_(grads, max_value)


def unscale_and_check_(params: Sequence[torch.Tensor], loss_scale: float) -> bool:
    """Divide the gradients of ``params`` by ``loss_scale`` in place (float16's loss scaling;
    1: none) and say whether any is inf or NaN: one fused pass per device and one wait,
    torch's own (``torch.amp.GradScaler``'s unscale)."""
    by_device: dict = {}
    for p in params:
        if p.grad is not None:
            by_device.setdefault(p.grad.device, []).append(p.grad)
    found = []
    for device, grads in by_device.items():
        flag = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, torch.full((1,), 1.0 / loss_scale,
                                                                                  device=device))
        found.append(flag)
    return bool(sum(f.item() for f in found))
