"""Sum gradients across processes in buckets, launched from autograd hooks during backward.

Parameters are packed, in reverse registration order (roughly the order backward produces
their gradients), into flat buckets of about ``bucket_cap_mb``. A hook fires when a
parameter's gradient is accumulated; once every in-process replica has its gradient, the
last one sums them into the bucket (reduce locally first), and once a bucket is full it is
sent to ``all_reduce`` asynchronously while backward goes on with the earlier layers.
Buckets are launched strictly in index order, so every process issues the same sequence of
collectives whatever order its threads finish in.

Each bucket also carries, per parameter, how many replicas produced a gradient (so a
parameter unused on *every* process is known to be stale everywhere), and the last bucket
can carry this process's denominator (its number of samples, or a loss's weighted count)
and up to ``EXTRA_SLOTS`` more numbers to sum (the stop flags of ``stopping.py``), so
neither costs a message of its own.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Collection, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ...core import tracing as trace
from ...distributed.collective import Collective
from .base import Extras, extra_count
from .sparse import local_sum, sum_sparse

DEFAULT_BUCKET_MB = 25.0
#: Numbers besides the gradients the last bucket can sum (see ``prepare``).
EXTRA_SLOTS = 5


@dataclass
class _Bucket:
    params: List[int]                       # parameter indices
    offsets: List[int]
    numel: int
    buffer: Optional[torch.Tensor] = None   # [grads..., one count per parameter, denominator, extras...]
    pending: int = 0
    written: List[bool] = field(default_factory=list)
    present: List[int] = field(default_factory=list)    # replicas with a gradient, per parameter
    work: object = None
    launched_us: int = 0                    # when its all_reduce was launched (for --trace)


def plan_buckets(sizes: Sequence[Tuple[int, torch.dtype]], cap_bytes: int) -> List[List[int]]:
    """Group parameter indices into buckets of at most ``cap_bytes`` (one dtype per bucket),
    last parameter first. A parameter larger than the cap gets a bucket of its own."""
    buckets: List[List[int]] = []
    current: List[int] = []
    used, dtype = 0, None
    for j in reversed(range(len(sizes))):
        numel, dt = sizes[j]
        nbytes = numel * torch.empty((), dtype=dt).element_size()
        if current and (used + nbytes > cap_bytes or dt != dtype):
            buckets.append(current)
            current, used = [], 0
        current.append(j)
        used, dtype = used + nbytes, dt
    if current:
        buckets.append(current)
    return buckets


def _dense_strides(p: torch.Tensor) -> Tuple[int, ...]:
    """``p``'s strides if it is dense (contiguous in some dimension order), else contiguous ones."""
    return torch.empty_like(p, device="meta").stride()


class BucketReducer:
    """Sum the gradients of every replica of every process; see the module docstring.

    ``params[i][j]`` is parameter ``j`` of in-process replica ``i``. After ``finish``, each
    replica's gradient of an active parameter equals ``scale`` times the sum over all
    replicas of all processes.
    """

    def __init__(self, params: Sequence[Sequence[torch.Tensor]], collective: Collective,
                 bucket_cap_mb: float = DEFAULT_BUCKET_MB, comm_device: Optional[torch.device] = None,
                 sparse: Collection[int] = ()):
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        self.params = [list(g) for g in params]
        self.collective = collective
        self.comm_device = comm_device or torch.device("cpu")
        first = self.params[0]
        # Parameters with sparse gradients (``sparse.py``) stay out of the buckets: summed at the end.
        self.sparse = sorted(sparse)
        self.sparse_totals: Dict[int, torch.Tensor] = {}
        dense = [j for j in range(len(first)) if j not in set(sparse)]
        plan = [[dense[k] for k in idx]
                for idx in plan_buckets([(first[j].numel(), first[j].dtype) for j in dense], int(bucket_cap_mb * 2**20))]
        plan = plan or [[]]         # (no dense parameter: an empty bucket still carries the numbers)
        self.buckets: List[_Bucket] = []
        self.where: List[Tuple[int, int]] = [(0, 0)] * len(first)    # param -> (bucket, slot)
        for b, idx in enumerate(plan):
            offsets, total = [], 0
            for slot, j in enumerate(idx):
                offsets.append(total)
                total += first[j].numel()
                self.where[j] = (b, slot)
            # The counts ride in the same dtype as the gradients: exact for small integers.
            dtype = first[idx[0]].dtype if idx else torch.float32
            buf = torch.zeros(total + len(idx) + 1 + EXTRA_SLOTS, dtype=dtype, device=self.comm_device)
            self.buckets.append(_Bucket(idx, offsets, total, buf))
        self._lock = threading.Lock()
        self._arrived = [0] * len(first)
        self._next = 0
        self._denominator = None
        self._extras: Extras = None
        self._every = dense
        self._missing = False       # some parameter of this process had no gradient this step
        self.enabled = True
        # One replica in this process: its gradients *are* views into the buckets, so
        # backward accumulates straight into them and nothing is copied in or out (as DDP's
        # gradient_as_bucket_view). Measured on ResNet-18's 43 MiB of gradients: the two
        # copies took the sync from 0.95 to 0.67 of a flat all_reduce's bus bandwidth.
        self.views = len(self.params) == 1 and all(p.device == self.comm_device for p in first)
        # Each view has its parameter's memory layout (e.g. channels_last): autograd then
        # accumulates into it in place, and every process and mode packs the same way.
        self._views = [None if j in self.sparse else self._slice(j).as_strided(p.shape, _dense_strides(p))
                       for j, p in enumerate(first)]
        # Where each view's memory is. A view given out as a gradient can be moved off its bucket
        # by the user's code while it is one: Module.to (a copy, even to "cpu:0" from "cpu"),
        # .cpu() and back, a memory format, all set ``param.grad.data``, which is the view
        # object itself. Those views are made anew (``_view``); their parameters' gradients
        # then went to no bucket, and each process stepped on its own.
        self._ptrs = [None if v is None else v.data_ptr() for v in self._views]
        if self.views:
            self.reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._hook_for(j))
                         for g in self.params for j, p in enumerate(g)]
        self.prepare()

    def _slice(self, j: int) -> torch.Tensor:
        b_index, slot = self.where[j]
        bucket = self.buckets[b_index]
        start = bucket.offsets[slot]
        return bucket.buffer[start:start + self.params[0][j].numel()]

    def _view(self, j: int) -> torch.Tensor:
        """Parameter ``j``'s view of its bucket, made anew if user code moved it off (above)."""
        view = self._views[j]
        if view.data_ptr() != self._ptrs[j]:
            p = self.params[0][j]
            view = self._views[j] = self._slice(j).as_strided(p.shape, _dense_strides(p))
        return view

    def reset(self) -> None:
        """Zero the gradients (views mode): they are the buckets, so one fill per bucket."""
        for bucket in self.buckets:
            bucket.buffer[:bucket.numel].zero_()
        for j, p in enumerate(self.params[0]):
            p.grad = None if self._views[j] is None else self._view(j)   # (a sparse one: backward makes it)

    def _hook_for(self, j: int):
        def hook(_param: torch.Tensor) -> None:
            if not self.enabled:
                return
            with self._lock:
                self._arrived[j] += 1
                if self._arrived[j] == len(self.params):
                    self._write(j, arrived=True)
        return hook

    def prepare(self, denominator=None, extras: Extras = None) -> None:
        """Start a step; ``denominator`` (this process's: a number or a 0-d tensor) and
        ``extras`` (at most ``EXTRA_SLOTS`` numbers: a tensor, or Python numbers) ride in the
        last bucket when given. Python numbers are written with the bucket's counts, in the
        same copy; a tensor costs a copy of its own."""
        if extras is not None and extra_count(extras) > EXTRA_SLOTS:
            raise ValueError(f"at most {EXTRA_SLOTS} extra numbers ride with the gradients, got {extra_count(extras)}")
        with self._lock:
            self._arrived = [0] * len(self._arrived)
            self._next = 0
            self._denominator = denominator
            self._extras = extras
            self._missing = False
            for b in self.buckets:
                b.pending, b.written, b.work = len(b.params), [False] * len(b.params), None
                b.present = [0] * len(b.params)

    def _write(self, j: int, arrived: bool) -> None:
        """Sum parameter ``j`` over the in-process replicas into its bucket (lock held); a
        sparse one is summed by ``finish``."""
        if self._views[j] is None:
            return
        b_index, slot = self.where[j]
        bucket = self.buckets[b_index]
        have = 0
        if self.views:
            p = self.params[0][j]
            if p.grad is not None and p.grad.data_ptr() != self._ptrs[j]:   # replaced or moved off: put back
                view = self._view(j)
                view.copy_(p.grad)
                p.grad = view
            have = int(arrived)
        else:
            for g in self.params:
                grad = g[j].grad
                if grad is None:
                    continue
                if have == 0:
                    self._views[j].copy_(grad)
                else:
                    self._views[j].add_(grad.to(self.comm_device, non_blocking=True))
                have += 1
            if have == 0:
                self._views[j].zero_()
        bucket.present[slot] = have         # written into the bucket with the others at its launch
        self._missing = self._missing or have == 0
        bucket.written[slot] = True
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            bucket = self.buckets[self._next]
            last = self._next == len(self.buckets) - 1
            # The counts, and the denominator and extras given as numbers, in one copy (not
            # 2-3 operations a parameter: each a kernel on a GPU, 62 a step for ResNet-18).
            head = bucket.buffer[bucket.numel:]
            numbers = bucket.present + [0] * (head.numel() - len(bucket.present))
            at = len(bucket.params)
            denominator, extras = (self._denominator, self._extras) if last else (None, None)
            if denominator is not None and not isinstance(denominator, torch.Tensor):
                numbers[at] = denominator
            if extras is not None and not isinstance(extras, torch.Tensor):
                numbers[at + 1:at + 1 + len(extras)] = extras
            head.copy_(torch.tensor(numbers, dtype=head.dtype), non_blocking=True)
            if isinstance(denominator, torch.Tensor):
                head[at] = denominator
            if isinstance(extras, torch.Tensor):
                head[at + 1:at + 1 + extras.numel()] = extras.reshape(-1)
            bucket.launched_us = trace.now_us()
            bucket.work = self.collective.all_reduce_async(bucket.buffer)
            self._next += 1

    def finish(self) -> Tuple[List[int], Optional[torch.Tensor]]:
        """Send what backward did not, wait for every bucket, leave the sums in the buckets.

        Returns the parameters some replica of some process produced a gradient for, and the
        global denominator (a 0-d tensor) if ``prepare`` was given this process's. The sum
        of the processes' ``extras`` is then ``summed_extras``.
        """
        with self._lock:
            for j in self._every:
                b_index, slot = self.where[j]
                if not self.buckets[b_index].written[slot]:
                    self._write(j, arrived=False)
            self._launch_ready()        # (an empty bucket: no parameter launched it)
        for k, bucket in enumerate(self.buckets):
            if bucket.work is not None:
                bucket.work.wait()
                trace.event(f"all_reduce bucket {k}", "comm", bucket.launched_us, trace.now_us())
                # Drop the handle now: a gloo work object still alive when the interpreter
                # exits can abort the process ("terminate called without an active exception").
                bucket.work = None
        if self._missing:
            used = []
            for bucket in self.buckets:        # one device-to-host copy per bucket, not per parameter
                counts = bucket.buffer[bucket.numel:bucket.numel + len(bucket.params)].cpu()
                used += [j for j, c in zip(bucket.params, counts.tolist()) if c > 0]
        else:
            # This process had every gradient, so every summed count is > 0: nothing to read.
            # (On a GPU a read is a wait: the host could not queue the update and the next
            # forward while the all_reduce runs.)
            used = list(self._every)
        self.sparse_totals = {}
        for j in self.sparse:          # in index order, the same on every process
            mine = local_sum([g[j].grad for g in self.params], self.comm_device)
            total = sum_sparse(self.collective, mine, self.params[0][j], self.comm_device)
            if total is not None:
                self.sparse_totals[j] = total
                used.append(j)
        last = self.buckets[-1]
        tail = last.buffer[last.numel + len(last.params):]
        total = tail[0] if self._denominator is not None else None
        self.summed_extras = tail[1:1 + extra_count(self._extras)].clone() if self._extras is not None else None
        return sorted(used), total

    summed_extras: Optional[torch.Tensor] = None

    def scatter(self, device_index: int, active: Sequence[int], scale=None) -> None:
        """Leave ``scale`` (a float, a 0-d tensor, or None for 1) times the summed gradients in
        replica ``device_index``; parameters not in ``active`` get no gradient (the optimizer
        skips them)."""
        g = self.params[device_index]
        is_active = set(active)
        for j, total in self.sparse_totals.items():
            if j in is_active:
                total = total if scale is None else total * scale
                g[j].grad = total.to(g[j].device)
        if self.views:
            if scale is not None:
                for bucket in self.buckets:
                    bucket.buffer[:bucket.numel].mul_(scale)
            for j, p in enumerate(g):
                if self._views[j] is not None or j not in is_active:
                    p.grad = self._views[j] if j in is_active else None
            return
        for j in active:
            total = self._views[j]
            if total is None:       # (sparse: set above)
                continue
            if g[j].grad is None or g[j].grad.device != g[j].device:
                g[j].grad = torch.empty_like(g[j])
            if scale is None:
                g[j].grad.copy_(total, non_blocking=True)
            elif total.device == g[j].device:
                torch.mul(total, scale, out=g[j].grad)      # copy and scale in one pass
            else:       # another GPU than the buckets': copy, then scale there
                g[j].grad.copy_(total, non_blocking=True).mul_(
                    scale.to(g[j].device, non_blocking=True) if isinstance(scale, torch.Tensor) else scale)
        for j, p in enumerate(g):
            if j not in is_active:
                p.grad = None

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes in this block only accumulate gradients locally."""
        before, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = before

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
