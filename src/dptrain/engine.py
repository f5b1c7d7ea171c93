"""A Task's model on the devices of one process: one training step per batch, and evaluation.

Each step splits this process's batch (any structure) over the devices, runs forward and
backward of every shard at once, and lets the ``Trainer`` sum the gradients over devices
and processes and divide them once by the global denominator (``losses.py``), so N devices
and N processes take the step one device takes on the whole global batch.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .batch import Batch, batch_size, input_and_target, split_structure, to_device
from .compiled import check_mode, compile_replicas, warm_up, without_prefix
from .losses import Count, LossAdapter
from .replicas import replicate
from .split import shard_sizes
from .syncbn import synchronized
from . import trace
from .task import Task
from .trainer import Trainer

Totals = Dict[str, torch.Tensor]


def default_forward(model: nn.Module, batch: Batch) -> Tuple[Any, Any]:
    """``(x, y)`` -> ``(model(x), y)``; see ``batch.input_and_target`` for the other shapes."""
    (args, kwargs), target = input_and_target(batch)
    if not kwargs:
        return model(*args), target
    try:
        return model(**kwargs), target
    except TypeError as e:
        if "keyword argument" not in str(e):
            raise
        raise TypeError(f"a dict batch goes to model(**batch) without its target, so its keys must be the "
                        f"arguments of {type(model).__name__}.forward ({e}); rename them, or pass "
                        f"forward=fn(model, batch) -> (output, target)") from None


def _host_number(count: Count) -> Count:
    # A count computed on the host is a plain number: sending a CPU tensor into a GPU bucket
    # would wait for the GPU.
    if isinstance(count, torch.Tensor) and count.device.type == "cpu":
        value = count.item()
        return int(value) if float(value).is_integer() else value
    return count


def _add(a: Count, b: Count) -> Count:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device != b.device:
        b = b.to(a.device, non_blocking=True)
    return a + b


class ModelEngine:
    """Train and evaluate ``task.model`` data-parallel on ``devices``.

    >>> engine = ModelEngine(task, [cpu(0), cpu(1)])
    >>> loss_sum, count = engine.train_batch(batch)     # one step on the whole batch
    >>> totals = engine.evaluate(loader)                # {"loss": ..., "count": ..., ...}
    """

    def __init__(self, task: Task, devices: Sequence[torch.device], kvstore: Optional[str] = "device",
                 sync_batchnorm: bool = False, amp: Optional[torch.dtype] = None, channels_last: bool = False,
                 bucket_cap_mb: float = 25.0, compile: Optional[str] = None):
        self.task = task
        self.adapter = LossAdapter(task.loss, task.reduction) if task.step is None else None
        self.forward = task.forward or default_forward
        self.memory_format = torch.channels_last if channels_last else None
        model = task.model
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.replicas = replicate(model, devices, init=task.init, sync_batchnorm=sync_batchnorm)
        self.devices = self.replicas.devices
        self.trainer = Trainer(self.replicas, task.optimizer, task.optimizer_params, kvstore=kvstore,
                               bucket_cap_mb=bucket_cap_mb)
        self.amp = amp
        self.runner = self.trainer.runner
        self.compile_mode = check_mode(compile)
        if self.compile_mode and sync_batchnorm:
            raise ValueError("--compile and --sync-bn do not go together: the synchronised BatchNorm waits for "
                             "every device inside the graph; drop one of them")
        self._nets: Optional[List[nn.Module]] = None
        self.compile_seconds = 0.0

    def _net(self, i: int) -> nn.Module:
        """Replica ``i``, through its ``torch.compile`` wrapper with ``--compile``."""
        return self._nets[i] if self._nets is not None else self.replicas[i]

    def compile(self, example: Batch) -> None:
        """With ``--compile``: compile every replica on ``example`` (a batch of this process,
        with the sizes of an epoch's shards), before training; see ``compiled.py``."""
        if not self.compile_mode:
            return
        if self._nets is None:
            self._nets = compile_replicas(list(self.replicas), self.compile_mode)
        n = batch_size(example)
        k = min(n, len(self.devices))
        shards = split_structure(example, shard_sizes(n, k, even_split=False)) if k > 1 else [example]

        def train(i: int, shard: Batch) -> None:
            with torch.enable_grad():
                value, _ = self._loss(self._net(i), to_device(shard, self.devices[i], self.memory_format),
                                      self.devices[i], count=False)
            value.backward()

        def evaluate(i: int, shard: Batch) -> None:
            self.replicas[i].eval()
            try:
                with torch.no_grad():
                    self._loss(self._net(i), to_device(shard, self.devices[i], self.memory_format), self.devices[i])
            finally:
                self.replicas[i].train()
        # On each device's own thread, as training runs them (dynamo's guards include the
        # thread's intra-op thread count), one device after another.
        calls = [lambda i=i, s=s, f=f: self.runner.run(i, f, i, s)
                 for f in (train, evaluate) for i, s in enumerate(shards)]
        # Left as they were: BatchNorm statistics, the random state (dropout), the gradients.
        buffers = [[b.clone() for b in m.buffers()] for m in self.replicas]
        rng = torch.get_rng_state()
        with self.trainer.no_sync():                # nothing sent: these gradients are thrown away
            self.compile_seconds += warm_up(calls)
        self.trainer.discard_gradients()
        torch.set_rng_state(rng)
        with torch.no_grad():
            for m, saved in zip(self.replicas, buffers):
                for b, v in zip(m.buffers(), saved):
                    b.copy_(v)

    @property
    def classification(self) -> bool:
        return self.adapter is not None and self.adapter.classification

    def prepare(self, example: Batch, lr: Optional[float] = None) -> None:
        """Materialise lazy layers with a one-sample batch, then set the learning rate."""
        def run(net: nn.Module, batch: Batch) -> None:
            self._loss(net, to_device(batch, self.devices[0], self.memory_format), self.devices[0])
        self.replicas.initialize(example, run)
        if lr is not None:
            self.trainer.set_learning_rate(lr)
        else:
            self.trainer.learning_rate      # builds the optimizers now: their lrs are checked here

    # -- training ----------------------------------------------------------------------
    def _autocast(self, device: torch.device):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.amp)

    def _loss(self, net: nn.Module, shard: Batch, device: torch.device,
              count: bool = True) -> Tuple[torch.Tensor, Count]:
        """The shard's loss as a sum, and its denominator (None: a sum, nothing to divide;
        not computed unless ``count``)."""
        with self._autocast(device):
            if self.adapter is not None:
                output, target = self.forward(net, shard)
                return self.adapter(output, target), self.adapter.count(target) if count else None
            out = self.task.step(net, shard)
        if isinstance(out, (tuple, list)):
            if len(out) != 2:
                raise ValueError(f"step returned {len(out)} values: return the loss, or (sum, count)")
            self._step_pairs = True
            return out[0].reshape(()), out[1]
        if not isinstance(out, torch.Tensor) or out.numel() != 1:
            raise ValueError(f"step must return the loss (one number) or (sum, count), got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        self._step_pairs = False
        if self.task.reduction == "sum":
            return out.reshape(()), None
        n = batch_size(shard)
        return out.reshape(()) * n, n

    _step_pairs: Optional[bool] = None      # whether the step function returns (sum, count)

    def _known_count(self, batch: Batch) -> Tuple[bool, Count]:
        """This process's denominator before any forward, when the batch alone tells it."""
        if self.adapter is None:
            if self.task.reduction == "sum" and self._step_pairs is False:
                return True, None
            if self._step_pairs is False:
                return True, batch_size(batch)
            return False, None          # not known yet whether the step returns (sum, count)
        if self.task.forward is not None:
            return False, None
        _, target = input_and_target(batch)
        return True, _host_number(self.adapter.count(target))

    def train_batch(self, batch: Batch, skip_nonfinite: bool = False, extras: Optional[torch.Tensor] = None,
                    sizes: Optional[Sequence[int]] = None, timed: bool = False) -> Tuple[torch.Tensor, Count]:
        """One step on this process's ``batch``: return its loss sum (on ``devices[0]``; NaN if
        the step was skipped) and what the loss is divided by (samples for a sum loss).

        ``skip_nonfinite``: if a gradient is NaN or infinite on any device of any process, the
        model is left as it was. ``extras``: numbers to sum over the processes with the
        gradients (the sum is then ``self.trainer.summed_extras``). ``sizes``: each device's
        part of the batch (``--balance``; default: as equal as can be). ``timed``: leave each
        device's forward and backward seconds in ``self.seconds`` (on a GPU it then waits).
        """
        n = batch_size(batch)
        # With several processes this is the process's part of the global batch: it may have
        # fewer samples than devices, or none; devices without samples contribute zeros.
        if sizes is None:
            k = min(n, len(self.devices))
            sizes = shard_sizes(n, k, even_split=False) + [0] * (len(self.devices) - k) if k else [0] * len(self.devices)
        if sum(sizes) != n or len(sizes) != len(self.devices):
            raise ValueError(f"the parts {list(sizes)} do not cut a batch of {n} samples over {len(self.devices)} "
                             f"devices")
        used = [s for s in sizes if s]
        parts = split_structure(batch, used) if len(used) > 1 else [batch] * len(used)
        shards: List[Optional[Batch]] = [parts.pop(0) if s else None for s in sizes]
        known, denominator = self._known_count(batch) if n else (True, 0)
        counts: List[Count] = [None] * len(self.devices)
        self.seconds = [0.0] * len(self.devices)

        def compute(i: int) -> torch.Tensor:
            if shards[i] is None:
                return self._idle(i)
            device = self.devices[i]
            start = time.perf_counter()
            with trace.span("forward", i), torch.enable_grad(), synchronized():   # BatchNorm across devices
                value, counts[i] = self._loss(self._net(i), to_device(shards[i], device, self.memory_format),
                                              device, count=not known)
            with trace.span("backward", i):
                value.backward()
            if timed:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                self.seconds[i] = time.perf_counter() - start
            return value.detach()

        def shard_counts() -> Count:        # once every shard has computed its own
            total = None
            for c in counts:
                total = _add(total, _host_number(c))
            return total
        losses = self.trainer.step_with(compute, denominator if known else shard_counts,
                                        skip_nonfinite=skip_nonfinite, extras=extras)
        loss = losses[0].double() if len(losses) == 1 else sum(v.double().to(self.devices[0]) for v in losses)
        if not known:
            denominator = shard_counts()
        if not self.trainer.stepped:
            loss = torch.full_like(loss, math.nan)
        return loss, (n if denominator is None else denominator)

    def _idle(self, i: int) -> torch.Tensor:
        for p in self.replicas[i].parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        return torch.zeros((), device=self.devices[i])

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, batches) -> Totals:
        """Sum the loss, its denominator, correct predictions (classification) and every metric's
        ``(sum, count)`` over ``batches``, split across the devices; in eval mode, without
        gradients. Sums stay on the devices until the end: one wait, not one per batch."""
        metrics = self.task.metrics
        if metrics and self.adapter is None and self.task.forward is None:
            raise ValueError("metrics need outputs and targets: with a step function, also give "
                             "forward=fn(model, batch) -> (output, target)")
        totals: List[Dict[str, Any]] = [{} for _ in self.devices]

        def shard_totals(i: int, shard: Batch) -> None:
            if shard is None:
                return
            net, out, device = self._net(i), totals[i], self.devices[i]
            shard = to_device(shard, device, self.memory_format)
            if self.adapter is None:
                value, count = self._loss(net, shard, device)
                _accumulate(out, "loss", value)
                _accumulate(out, "count", batch_size(shard) if count is None else count)
                if self.task.forward is None:
                    return
            with self._autocast(device):
                output, target = self.forward(net, shard)
            if self.adapter is not None:
                count = self.adapter.count(target)
                _accumulate(out, "loss", self.adapter(output, target))
                _accumulate(out, "count", batch_size(shard) if count is None else count)
                hits = self.adapter.correct(output, target)
                if hits is not None:
                    _accumulate(out, "correct", hits[0])
                    _accumulate(out, "correct_count", hits[1])
            for name, fn in metrics.items():
                pair = fn(output, target)
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise TypeError(f"metric {name!r} returned {type(pair).__name__}; a metric returns (sum, count), "
                                    f"e.g. ((output - target).abs().sum(), target.numel())")
                value, count = pair
                _accumulate(out, name, value)
                _accumulate(out, f"{name}_count", count)

        was_training = [m.training for m in self.replicas]
        self.replicas.eval()
        try:
            with torch.no_grad():
                for batch in batches:
                    n = batch_size(batch)
                    k = min(n, len(self.devices))
                    if k == 0:
                        continue
                    shards = split_structure(batch, shard_sizes(n, k, even_split=False))
                    self.runner.map(shard_totals, shards + [None] * (len(self.devices) - k))
        finally:
            for m, mode in zip(self.replicas, was_training):
                m.train(mode)
        out: Dict[str, Any] = {}
        for part in totals:
            for key, value in part.items():
                _accumulate(out, key, value.to(self.devices[0]) if isinstance(value, torch.Tensor) else value)
        return {k: torch.as_tensor(v, dtype=torch.float64, device=self.devices[0]) for k, v in out.items()}

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.replicas[0].state_dict(), "trainer": self.trainer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        try:
            for m in self.replicas:
                m.load_state_dict(without_prefix(state["model"]))
        except (KeyError, RuntimeError) as e:
            raise ValueError(f"the checkpoint's model does not fit this one: {str(e).splitlines()[0]}") from None
        self.trainer.load_state_dict(state["trainer"])


def _accumulate(out: Dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().double()
    out[key] = value if key not in out else _add(out[key], value)
