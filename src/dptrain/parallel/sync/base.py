"""One interface for every way of summing gradients: ``GradientSync``.

A strategy leaves every replica's parameters equal, as if one device had stepped on
``sum over devices and processes of the gradients / denominator``. The strategies, each in
its own module: ``device.py`` (each parameter summed and updated on its owner device),
``host.py`` (summed in host memory), ``scratch.py`` (the reference's hand-written
allreduce), ``processes.py`` (several processes, buckets sent during backward). The
``Trainer`` calls only the methods below; it never asks which strategy it has.

A step is a list of *phases*, each a function of the device index: phase p+1 starts on any
device only once phase p is done on all of them. What a step asks (denominator, numbers to
sum alongside, whether to check for NaN) and what it tells back (skipped, those sums) travel
in a ``SyncStep`` made for that step, not on the strategy's attributes. The operations on
lists of gradients that the strategies share (scale, norm, clip) are in ``grad_ops.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ContextManager, List, Optional, Sequence, Tuple, Union
import contextlib

import torch

from ...core.runner import DeviceRunner
from .. import bare_step
from .grad_ops import clamp_, grad_norm, scale_, scale_and_clip_, scaled_copies

Grads = List[List[Optional[torch.Tensor]]]     # [device][parameter]
Params = List[List[torch.Tensor]]               # [device][parameter]
#: What the summed gradient is divided by: a count, a 0-d tensor (e.g. a loss's weighted
#: count, left on its device so nothing waits for it), or None for no division.
Denominator = Union[int, float, torch.Tensor, None]
#: A few numbers to sum over the processes with the gradients: a tensor, or Python numbers
#: (cheaper to send: written with the gradients' bookkeeping in one copy).
Extras = Union[torch.Tensor, Sequence[float], None]
Phase = Callable[[int, Sequence[int]], None]      # (device index, active parameters)


@dataclass
class SyncStep:
    """One step's request to a strategy, and what the strategy says back.

    ``denominator``: this process's (or a function giving it once every device computed).
    ``extras``: a few numbers to sum over the processes with the gradients (the stop flags).
    ``check_finite``: skip the update if a summed gradient is NaN or infinite. ``max_norm``:
    clip the whole summed gradient (every parameter, device and process) to this norm;
    ``max_value``: then clip each of its elements to ``[-max_value, max_value]``.
    ``by_parameter``: with ``max_norm``, also keep each parameter's norm. ``keep_grads``:
    keep a copy of the summed, divided gradient of every parameter updated, before clipping
    (``kept_grads``: ``(indices, copies)``, one for each device that updates a part).
    Filled in by the phases: ``skipped`` (also when the summed denominator is 0: a batch
    with no counted target, whose mean is 0/0), ``summed_extras`` (None if they could not
    ride), ``grad_norm`` (the norm before clipping, when clipping) and, ``by_parameter``,
    ``parameter_norms``: ``(indices, norms, scale)``, a 1-d tensor of the norms of those
    parameters' summed gradients before clipping, which ``scale`` (``1 / denominator``; None:
    1) divides (then they are the parts of ``grad_norm``: ``parameter_norms``), one for each
    device that updates a part of them.
    """
    denominator: Union[Denominator, Callable[[], Denominator]] = None
    extras: Extras = None
    ignore_stale_grad: bool = False
    check_finite: bool = False
    max_norm: Optional[float] = None
    max_value: Optional[float] = None
    skipped: bool = False
    summed_extras: Extras = None
    grad_norm: Optional[torch.Tensor] = None
    by_parameter: bool = False
    parameter_norms: List[Tuple[Sequence[int], torch.Tensor, object]] = field(default_factory=list)
    keep_grads: bool = False
    kept_grads: List[Tuple[List[int], List[torch.Tensor]]] = field(default_factory=list)

    def keep_norms(self, indices: Sequence[int], norms: torch.Tensor, scale=None) -> None:
        """With ``by_parameter``: keep the norms of ``indices``' summed gradients and the
        ``scale`` that divides them, multiplied only when read (most steps are not logged;
        several owner threads may each keep theirs: a list's append is one step)."""
        if self.by_parameter:
            self.parameter_norms.append((list(indices), norms, scale))

    def keep(self, indices: Sequence[int], grads: Sequence[torch.Tensor], scale=None) -> None:
        """With ``keep_grads``: keep copies of ``indices``' summed gradients ``grads`` times
        ``scale`` (``1 / denominator``; None: 1), made now, before clipping changes them in
        place and the optimizer's ``zero_grad`` lets them go (or a bucket reuses their memory).
        One fused call; several owner threads may each keep theirs (a list's append is one step)."""
        if self.keep_grads and grads:
            self.kept_grads.append((list(indices), scaled_copies(list(grads), scale)))


def parameter_norms(parts: Sequence[Tuple[Sequence[int], torch.Tensor, object]]) -> dict:
    """``SyncStep.parameter_norms`` as numbers by parameter index (waits for the devices)."""
    out = {}
    for indices, norms, scale in parts:
        if scale is not None:
            norms = norms.double() * (scale.to(norms.device) if isinstance(scale, torch.Tensor) else scale)
        out.update(zip(indices, norms.tolist()))
    return out


def extra_count(extras: Extras) -> int:
    return 0 if extras is None else extras.numel() if isinstance(extras, torch.Tensor) else len(extras)


def resolve(denominator: Union[Denominator, Callable[[], Denominator]]) -> Denominator:
    """A denominator given as a function (known only once every device computed) is asked now."""
    return denominator() if callable(denominator) else denominator


def reciprocal(denominator: Denominator, device: Optional[torch.device] = None):
    """``1 / denominator`` as a float, or a 0-d float64 tensor on ``device``; None stays None."""
    denominator = resolve(denominator)
    if denominator is None:
        return None
    if isinstance(denominator, torch.Tensor):
        d = denominator.to(device or denominator.device, torch.float64, non_blocking=True)
        return torch.reciprocal(d.reshape(()))
    return 1.0 / denominator


def fill_unused(params: Params, active: Sequence[int]) -> None:
    """Zeros for the gradient of an active parameter on a device that did not use it (only
    from one thread, while the others wait: it writes every device's gradients)."""
    for j in active:
        for g in params:
            if g[j].grad is None:
                g[j].grad = torch.zeros_like(g[j])


class GradientSync:
    """Sum gradients over devices (and processes) and update the replicas; one device and
    one process: nothing to sum, every device updates its own (this class).

    ``phases`` runs inside the device threads (``Trainer.step_with``, one dispatch per step);
    ``step`` runs each phase as one dispatch (``Trainer.step``).
    """
    name: Optional[str] = None
    #: Indices of the parameters whose gradients are sparse (``sparse.py``), set before ``setup``.
    sparse: Sequence[int] = ()

    def __init__(self, runner: DeviceRunner):
        self.runner = runner
        self.devices = runner.devices

    def setup(self, params: Params, state: Sequence[torch.Tensor] = ()) -> None:
        """Called once before the first step with every replica's parameters and the first
        replica's other state (frozen parameters, buffers: what several processes share)."""

    def optimized(self, i: int) -> Optional[List[int]]:
        """Indices of the parameters device ``i``'s optimizer updates (None: all of them)."""
        return None

    def reduce(self, grads: Grads, active: Sequence[int]) -> None:
        """Leave in every device's gradient of each ``active`` parameter the sum over devices."""

    def prepare(self, step: SyncStep) -> None:
        """Called before the backward passes of a step (several processes send the
        denominator and extras with the gradients; one process sums nothing)."""
        step.summed_extras = step.extras

    def phases(self, params: Params, step: SyncStep, optimizers: Sequence[torch.optim.Optimizer]) -> List[Phase]:
        """Default: clear stale gradients; sum everything (from device 0's thread); every
        device scales its gradients and updates its replica."""
        def clear_stale(i: int, active: Sequence[int]) -> None:
            is_active = set(active)
            for j, p in enumerate(params[i]):   # a stale parameter is skipped by the optimizer
                if j not in is_active:
                    p.grad = None

        def reduce(i: int, active: Sequence[int]) -> None:
            if i == 0 and len(params) > 1:
                fill_unused(params, active)
                self.reduce([[p.grad for p in g] for g in params], active)

        def update(i: int, active: Sequence[int]) -> None:
            grads = [params[i][j].grad for j in active]
            scale = reciprocal(step.denominator, self.devices[i])
            if i == 0:      # (every device holds the whole sum)
                step.keep(active, grads, scale)
            if step.max_norm is None:
                scale_(grads, scale)
            else:           # every device holds the whole sum: the same norm
                keep = step if i == 0 else None
                norm = scale_and_clip_(grads, scale, step.max_norm,
                                       grad_norm(grads, self.devices[i], keep, active, scale))
                if i == 0:
                    step.grad_norm = norm
            clamp_(grads, step.max_value)
            bare_step.step(optimizers[i])
            bare_step.zero_grad(optimizers[i])
        return [clear_stale, reduce, update]

    def step(self, params: Params, active: Sequence[int], step: SyncStep,
             optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Sum the gradients of ``active`` parameters, divide them, update every replica."""
        for phase in self.phases(params, step, optimizers):
            self.runner.map(lambda i: phase(i, active))

    def no_sync(self) -> ContextManager[None]:
        """Backward passes in this block only accumulate locally (nothing to send here)."""
        return contextlib.nullcontext()

    def discard(self, params: Params) -> None:
        """Forget the gradients accumulated since the last step."""
        for group in params:
            for p in group:
                p.grad = None

    def close(self) -> None:
        """Take back whatever the strategy attached to the parameters (hooks)."""
