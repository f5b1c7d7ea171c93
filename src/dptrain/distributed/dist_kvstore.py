"""The ``dist`` KVStore: gradients summed over the devices of a process, then over the
processes, in buckets launched from backward's hooks (``reducer.py``)."""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..kvstore import Denominator, KVStore, Params, Phase, reciprocal, resolve
from ..parallel import DeviceRunner
from .reducer import BucketReducer


class DistKVStore(KVStore):
    """Several processes: sum locally, then across processes in buckets launched from hooks.

    Parameters (and the buffers the Trainer passes) are broadcast from rank 0 at setup.
    Every in-process device then updates its replica with the same summed gradient, divided
    by the *global* number of samples (so uneven shards are weighted by their size).
    """
    name = "dist"

    def __init__(self, runner: DeviceRunner, collective, bucket_cap_mb: float = 25.0):
        super().__init__(runner)
        self.collective, self.bucket_cap_mb = collective, bucket_cap_mb
        self.reducer = None

    def setup_groups(self, groups: Params, buffers: Sequence[torch.Tensor] = ()) -> None:
        self.collective.broadcast_tensors(list(groups[0]) + list(buffers))
        with torch.no_grad():
            for g in groups[1:]:
                for p, q in zip(g, groups[0]):
                    p.copy_(q)
        comm = self.devices[0] if getattr(self.collective, "device", torch.device("cpu")).type == "cuda" \
            else torch.device("cpu")
        self.reducer = BucketReducer(groups, self.collective, self.bucket_cap_mb, comm)

    def prepare(self, denominator: Denominator = None, extras: Optional[torch.Tensor] = None) -> None:
        self.reducer.prepare(denominator, extras)
        self.summed_extras = None

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.remove()
            self.reducer = None

    def phases(self, params: Params, denominator: Denominator,
               optimizers: Sequence[torch.optim.Optimizer]) -> List[Phase]:
        state = {}

        def reduce(i: int, active: Sequence[int]) -> None:
            if i == 0:
                used, total = self.reducer.finish()
                self.summed_extras = self.reducer.summed_extras
                local = resolve(denominator)
                if len(used) < len(params[0]) and not self.ignore_stale_grad:
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
                # The sums are the same bytes in every process, so all decide alike.
                self.skipped = self.check_finite and not all(
                    bool(torch.isfinite(b.buffer[:b.numel]).all()) for b in self.reducer.buckets)

        def update(i: int, active: Sequence[int]) -> None:
            if not self.skipped:
                self.reducer.scatter(i, state["used"], state["scale"])
                optimizers[i].step()
            if self.reducer.views:
                self.reducer.reset()
            else:
                optimizers[i].zero_grad(set_to_none=True)
            if i == 0:
                self.reducer.prepare()
        return [reduce, update]
