"""A Gluon-style Trainer: sum gradients over devices, scale by 1/batch_size, update every replica.

    replicas = dptrain.replicate(net, devices)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1}, kvstore="device")
    for X, y in loader:
        Xs, ys = dptrain.split_batch(X, y, devices)
        replicas.forward_backward(Xs, ys)
        trainer.step(len(X))

Every device runs the same optimizer on the same summed gradient, so the replicas stay
identical. Gradients are cleared after each step; a parameter with no gradient at the next
step is "stale" and an error, unless ``ignore_stale_grad=True`` (then it is not updated).
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import torch
from torch import nn

from .devices import DeviceLike, check_devices, cpu
from .distributed.collective import get_collective
from .kvstore import DistKVStore, KVStore, create_kvstore
from .optim import check_optimizer, make_optimizer
from .parallel import get_runner
from .replicas import Replicas

T = TypeVar("T")
Params = Union[Replicas, nn.Module, Sequence[torch.Tensor], Sequence[Sequence[torch.Tensor]]]


def _device_of(t: torch.Tensor) -> torch.device:
    return t.device if t.device.type != "cpu" else cpu(0)


class Trainer:
    """Update model replicas with summed gradients; see the module docstring for the loop.

    ``params_or_replicas``: a ``Replicas``; one ``nn.Module`` or parameter list (one device);
    or one parameter list per device (the from-scratch layout), with ``devices`` naming them.
    """

    def __init__(self, params_or_replicas: Params, optimizer: str = "sgd",
                 optimizer_params: Optional[Mapping[str, Any]] = None,
                 kvstore: Optional[str] = "device", devices: Optional[Sequence[DeviceLike]] = None,
                 bucket_cap_mb: float = 25.0):
        self._optimizer_params = check_optimizer(optimizer, optimizer_params)
        self._optimizer_name = optimizer.lower()
        self._source = params_or_replicas
        if isinstance(params_or_replicas, Replicas):
            self.devices = params_or_replicas.devices
            self._replicas: Optional[Replicas] = params_or_replicas
        else:
            self._replicas = None
            self._groups = self._parameter_groups(params_or_replicas)
            self.devices = check_devices(devices) if devices is not None else \
                [cpu(i) for i in range(len(self._groups))] if all(
                    _device_of(g[0]).type == "cpu" for g in self._groups) else \
                [_device_of(g[0]) for g in self._groups]
            if len(self.devices) != len(self._groups):
                raise ValueError(f"got {len(self._groups)} parameter lists for {len(self.devices)} devices")
        self.runner = get_runner(self.devices)
        self.collective = get_collective()
        self.kvstore: KVStore = create_kvstore(kvstore, self.runner, self.collective, bucket_cap_mb)
        self._optimizers: List[torch.optim.Optimizer] = []
        if self._replicas is None or self._replicas.initialized:
            # Now, before any backward: several processes start from rank 0's parameters.
            self._setup()

    @staticmethod
    def _parameter_groups(source) -> List[List[torch.Tensor]]:
        if isinstance(source, nn.Module):
            return [list(source.parameters())]
        items = list(source)
        if not items:
            raise ValueError("Trainer got no parameters")
        if all(isinstance(p, torch.Tensor) for p in items):
            return [items]
        groups = [list(g) for g in items]
        if len({len(g) for g in groups}) != 1:
            raise ValueError("every device needs the same parameters: got lists of lengths "
                             f"{[len(g) for g in groups]}")
        return groups

    def _setup(self) -> None:
        if self._replicas is not None:
            self._groups = [list(m.parameters()) for m in self._replicas]
        for g in self._groups:
            for p in g:
                if not p.requires_grad:
                    p.requires_grad_(True)
        if isinstance(self.kvstore, DistKVStore):
            buffers = list(self._replicas[0].buffers()) if self._replicas is not None else []
            self.kvstore.setup_groups(self._groups, buffers)
            self._broadcast_buffers()
        else:
            self.kvstore.setup(self._groups[0])
        self._optimizers = []
        for i, g in enumerate(self._groups):
            mine = self.kvstore.optimized(i)
            tensors = g if mine is None else [g[j] for j in mine]
            # A device that owns no parameter still gets an optimizer (over none): a dummy.
            self._optimizers.append(make_optimizer(self._optimizer_name, self._optimizer_params,
                                                   tensors or [torch.zeros(0, requires_grad=True)]))

    @property
    def learning_rate(self) -> float:
        return float(self._optimizer_params["learning_rate"])

    def set_learning_rate(self, lr: float) -> None:
        """Change the learning rate from the next step on (schedules, warm-up)."""
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning rate must be a finite number > 0, got {lr!r}")
        self._optimizer_params["learning_rate"] = lr
        for opt in self._optimizers:
            for group in opt.param_groups:
                group["lr"] = lr

    def step(self, batch_size: int, ignore_stale_grad: bool = False, skip_nonfinite: bool = False) -> bool:
        """Sum gradients over devices, divide by ``batch_size``, update every replica.

        ``skip_nonfinite``: if any gradient, on any device of any process, is NaN or
        infinite, update nothing, clear the gradients and return False (as AMP's grad
        scaler skips a step); every process decides alike. Returns whether it updated.
        """
        self._check_batch_size(batch_size)
        if not self._optimizers:
            self._setup()
        if skip_nonfinite and self.collective.world_size == 1 and not self._grads_finite():
            for group in self._groups:
                for p in group:
                    p.grad = None
            return False
        active = self._active(ignore_stale_grad)
        self.kvstore.ignore_stale_grad = ignore_stale_grad
        self.kvstore.check_finite = skip_nonfinite      # several processes: on the summed gradients
        try:
            self.kvstore.step(self._groups, active, batch_size, self._optimizers)
        finally:
            self.kvstore.check_finite = False
        self._broadcast_buffers()
        return not self.kvstore.skipped

    def _grads_finite(self) -> bool:
        grads = [p.grad for group in self._groups for p in group if p.grad is not None]
        return all(bool(torch.isfinite(g).all()) for g in grads)

    def step_with(self, compute: Callable[[int], T], batch_size: int,
                  ignore_stale_grad: bool = False, prescaled_total: Optional[int] = None) -> List[T]:
        """Run ``compute(i)`` (forward and backward of shard ``i``) on every device, then ``step``.

        The same result as calling ``compute`` on every device and then ``step``, but each
        device thread goes on from its backward straight into the step's phases, meeting
        the others at a barrier, instead of returning to the caller between phases
        (measured: GluonLeNet steps on 2 CPU devices 7% faster).

        ``prescaled_total``: with several processes, ``compute`` already divided its loss by
        this global sample count (``global_samples``), so the gradients need no scaling.
        """
        self._check_batch_size(batch_size)
        if not self._optimizers:      # the first step (lazy modules): the plain way
            out = self.runner.map(lambda i: compute(i))
            self.step(batch_size, ignore_stale_grad)
            return out
        self.kvstore.prepare(batch_size, prescaled_total)
        self.kvstore.ignore_stale_grad = ignore_stale_grad
        phases = self.kvstore.phases(self._groups, batch_size, self._optimizers)
        barrier = threading.Barrier(len(self.devices))

        def work(i: int):
            try:
                out = compute(i)
                barrier.wait()
                active = self._active(ignore_stale_grad)   # every device computes the same
                for phase in phases:
                    phase(i, active)
                    barrier.wait()
                return out, None
            except threading.BrokenBarrierError as e:      # another device failed first
                return None, e
            except BaseException as e:
                barrier.abort()
                return None, e
        results = self.runner.map(work)
        errors = [e for _, e in results if e is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        self._broadcast_buffers()
        return [out for out, _ in results]

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: backward passes in this block send nothing.

        >>> with trainer.no_sync():
        ...     replicas.forward_backward(Xs1, ys1)      # micro-batch 1: kept local
        >>> replicas.forward_backward(Xs2, ys2)          # micro-batch 2: sums both, sends
        >>> trainer.step(len1 + len2)
        """
        if not self._optimizers:
            self._setup()
        reducer = getattr(self.kvstore, "reducer", None)
        if reducer is None:
            yield
            return
        with reducer.no_sync():
            yield

    @property
    def world_size(self) -> int:
        return self.collective.world_size

    def global_samples(self, batch_size: int) -> int:
        """The number of samples of this step over all processes (``batch_size`` here)."""
        if self.collective.world_size == 1:
            return batch_size
        return int(self.collective.all_reduce(torch.tensor([float(batch_size)])).item())

    def _check_batch_size(self, batch_size: int) -> None:
        # With several processes, one may have no sample in a last, small batch.
        least = 0 if self.collective.world_size > 1 else 1
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < least:
            raise ValueError(f"step needs the batch size (an integer >= {least}), got {batch_size!r}")

    def _active(self, ignore_stale_grad: bool) -> List[int]:
        """Indices of the parameters with a gradient on every device; stale ones are an error."""
        active = []
        for j in range(len(self._groups[0])):
            missing = [i for i, g in enumerate(self._groups) if g[j].grad is None]
            if not missing:
                active.append(j)
            elif not ignore_stale_grad:
                raise ValueError(
                    f"parameter {self._name(j)} got no gradient on device(s) "
                    f"{', '.join(str(self.devices[i]) for i in missing)} since the last step: the "
                    f"model used only some of its parameters. Call step(batch_size, "
                    f"ignore_stale_grad=True) to skip such parameters")
        return active

    def _broadcast_buffers(self) -> None:
        # As DistributedDataParallel does: running statistics follow device 0 of rank 0, so
        # every replica evaluates the same model.
        if self._replicas is None:
            return
        source = [b for b in self._replicas[0].buffers()]
        if not source:
            return
        self.collective.broadcast_tensors(source)
        if len(self.devices) == 1:
            return

        def copy(i: int) -> None:
            if i:
                for b, s in zip(self._replicas[i].buffers(), source):
                    b.copy_(s, non_blocking=True)
        self.runner.map(copy)

    def state_dict(self) -> dict:
        """The optimizers' state (one per device; with kvstore "device" each holds its share)."""
        if not self._optimizers:
            self._setup()
        return {"optimizer": self._optimizer_name, "kvstore": self.kvstore.name,
                "optimizers": [opt.state_dict() for opt in self._optimizers]}

    def load_state_dict(self, state: dict) -> None:
        if not self._optimizers:
            self._setup()
        saved = state.get("optimizers", [])
        if state.get("optimizer") != self._optimizer_name or len(saved) != len(self._optimizers) \
                or state.get("kvstore") != self.kvstore.name:
            raise ValueError(f"the checkpoint's optimizer state is for {state.get('optimizer')!r} on {len(saved)} "
                             f"device(s) with kvstore {state.get('kvstore')!r}; this run uses "
                             f"{self._optimizer_name!r} on {len(self._optimizers)} with {self.kvstore.name!r}")
        for opt, sd in zip(self._optimizers, saved):
            opt.load_state_dict(sd)

    def _name(self, j: int) -> str:
        if self._replicas is not None:
            return repr(list(dict(self._replicas[0].named_parameters()))[j])
        return f"#{j} (shape {tuple(self._groups[0][j].shape)})"

