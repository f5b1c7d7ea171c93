"""Several processes: gradients summed over the devices of a process, then over the
processes, in buckets launched from backward's hooks (``buckets.py``)."""
from __future__ import annotations

from typing import ContextManager, List, Sequence

import torch

from ...core.runner import DeviceRunner
from .. import bare_step
from ...distributed.collective import Collective
from .base import GradientSync, Params, Phase, SyncStep, reciprocal, resolve
from .grad_ops import clamp_, clip_, grad_norm
from .buckets import DEFAULT_BUCKET_MB, BucketReducer


class ProcessSync(GradientSync):
    """Sum locally, then across processes in buckets launched from hooks.

    Parameters (and the other state the Trainer passes: frozen parameters, buffers) are
    broadcast from rank 0 at setup. Every in-process device then updates its replica with the
    same summed gradient, divided by the *global* denominator (so uneven shards are weighted
    by their size).
    """
    name = "dist"

    def __init__(self, runner: DeviceRunner, collective: Collective, bucket_cap_mb: float = DEFAULT_BUCKET_MB):
        super().__init__(runner)
        self.collective, self.bucket_cap_mb = collective, bucket_cap_mb
        self.reducer = None

    def setup(self, params: Params, state: Sequence[torch.Tensor] = ()) -> None:
        self.collective.broadcast_tensors(list(params[0]) + list(state))
        with torch.no_grad():
            for g in params[1:]:
                for p, q in zip(g, params[0]):
                    p.copy_(q)
        comm = self.devices[0] if getattr(self.collective, "device", torch.device("cpu")).type == "cuda" \
            else torch.device("cpu")
        self.reducer = BucketReducer(params, self.collective, self.bucket_cap_mb, comm, self.sparse)

    def prepare(self, step: SyncStep) -> None:
        self.reducer.prepare(None if callable(step.denominator) else step.denominator, step.extras)
        step.summed_extras = None

    def no_sync(self) -> ContextManager[None]:
        return self.reducer.no_sync()

    def discard(self, params: Params) -> None:
        if self.reducer.views:
            self.reducer.reset()        # the gradients are the buckets: zero them in place
        else:
            super().discard(params)

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.remove()
            self.reducer = None

    def phases(self, params: Params, step: SyncStep, optimizers: Sequence[torch.optim.Optimizer]) -> List[Phase]:
        state = {}

        def reduce(i: int, active: Sequence[int]) -> None:
            if i == 0:
                used, total = self.reducer.finish()
                step.summed_extras = self.reducer.summed_extras
                local = resolve(step.denominator)
                if len(used) < len(params[0]) and not step.ignore_stale_grad:
                    missing = sorted(set(range(len(params[0]))) - set(used))
                    raise ValueError(
                        f"parameter(s) #{', #'.join(map(str, missing[:5]))} got no gradient on any process "
                        f"since the last step: the model used only some of its parameters. Call "
                        f"step(batch_size, ignore_stale_grad=True) to skip such parameters")
                if local is None:
                    scale = None
                else:
                    if total is None:       # the denominator did not ride in the last bucket
                        total = self.collective.all_reduce(
                            torch.as_tensor(local, dtype=torch.float64).reshape(1).clone())[0]
                    scale = reciprocal(total)
                state["used"], state["scale"] = used, scale
                # The sums are the same bytes in every process, so all decide alike. A summed
                # denominator of 0 (no target counted in any process: a mean of 0/0) is no
                # update, seen now, not as NaN weights a batch later (read on CPUs only: on a
                # GPU the read would make the host wait for the device before every update).
                nothing = isinstance(total, torch.Tensor) and total.device.type == "cpu" and float(total) == 0
                step.skipped = nothing or step.check_finite and not all(
                    bool(torch.isfinite(t).all()) for t in [b.buffer[:b.numel] for b in self.reducer.buckets]
                    + [s.values() for s in self.reducer.sparse_totals.values()])

        def update(i: int, active: Sequence[int]) -> None:
            if not step.skipped:
                self.reducer.scatter(i, state["used"], state["scale"])
                clipping = step.max_norm is not None or step.max_value is not None
                if clipping or (i == 0 and step.keep_grads):    # the same sum in every process
                    held = [j for j, p in enumerate(params[i]) if p.grad is not None]
                    grads = [params[i][j].grad for j in held]
                    if i == 0:
                        step.keep(held, grads)      # (divided already, before clipping)
                    if step.max_norm is not None:
                        norm = clip_(grads, grad_norm(grads, self.devices[i], step if i == 0 else None, held),
                                     step.max_norm)
                        if i == 0:
                            step.grad_norm = norm
                    clamp_(grads, step.max_value)
                bare_step.step(optimizers[i])
            if self.reducer.views:
                self.reducer.reset()
            else:
                bare_step.zero_grad(optimizers[i])
            if i == 0:
                self.reducer.prepare()
        return [reduce, update]
