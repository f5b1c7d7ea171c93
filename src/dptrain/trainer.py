"""A Gluon-style Trainer: sum gradients over devices, scale by 1/batch_size, update every replica.

    replicas = dptrain.replicate(net, devices)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1}, kvstore="device")
    for X, y in loader:
        Xs, ys = dptrain.split_batch(X, y, devices)
        replicas.forward_backward(Xs, ys)
        trainer.step(len(X))

Every device runs the same optimizer on the same summed gradient, so the replicas stay
identical. The optimizer is a Gluon name or any ``torch.optim`` optimizer (see ``optim.py``);
``trainer.optimizer`` takes ``lr_scheduler``s. Frozen parameters (``requires_grad=False``)
are left alone. Gradients are cleared after each step; a parameter with no gradient at the
next step is "stale" and an error, unless ``ignore_stale_grad=True`` (then it is not updated).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import torch
from torch import nn

from . import trace
from .devices import DeviceLike, check_devices, cpu
from .distributed.collective import get_collective
from .distributed.dist_kvstore import DistKVStore
from .kvstore import Denominator, KVStore, create_kvstore
from .optim import (OptimizerPlan, OptimizerSpec, ReplicatedOptimizer, check_learning_rate, check_optimizer,
                    load_optimizer_state, optimizer_state)
from .parallel import get_runner
from .replicas import Replicas

T = TypeVar("T")
Params = Union[Replicas, nn.Module, Sequence[torch.Tensor], Sequence[Sequence[torch.Tensor]]]


def _device_of(t: torch.Tensor) -> torch.device:
    return t.device if t.device.type != "cpu" else cpu(0)


class _NoBarrier:
    """One device: nobody to wait for."""

    def wait(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Trainer:
    """Update model replicas with summed gradients; see the module docstring for the loop.

    ``params_or_replicas``: a ``Replicas``; one ``nn.Module`` or parameter list (one device);
    or one parameter list per device (the from-scratch layout), with ``devices`` naming them.
    ``optimizer``: a name (``"sgd"``, ``"nag"``, ``"adam"``, ``"adamw"``) with
    ``optimizer_params``, a ``torch.optim`` class or factory (``torch.optim.AdamW``,
    ``functools.partial(torch.optim.SGD, lr=0.1)``), or an optimizer built on the model.
    """

    def __init__(self, params_or_replicas: Params, optimizer: OptimizerSpec = "sgd",
                 optimizer_params: Optional[Mapping[str, Any]] = None,
                 kvstore: Optional[str] = "device", devices: Optional[Sequence[DeviceLike]] = None,
                 bucket_cap_mb: float = 25.0):
        if isinstance(optimizer, str):
            check_optimizer(optimizer, optimizer_params)          # a typo fails here, not at step 1
        self._spec, self._optimizer_params = optimizer, optimizer_params
        self._frozen: List[torch.Tensor] = []
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
        self._origins: List[List[int]] = []
        self.optimizer: Optional[ReplicatedOptimizer] = None
        if self._replicas is None or self._replicas.initialized:
            # Now, before any backward: several processes start from rank 0's parameters.
            self._setup()

    def _parameter_groups(self, source) -> List[List[torch.Tensor]]:
        if isinstance(source, nn.Module):
            self._frozen = [p for p in source.parameters() if not p.requires_grad]
            groups = [[p for p in source.parameters() if p.requires_grad]]
        else:
            items = list(source)
            if not items:
                raise ValueError("Trainer got no parameters")
            groups = [items] if all(isinstance(p, torch.Tensor) for p in items) else [list(g) for g in items]
            if len({len(g) for g in groups}) != 1:
                raise ValueError("every device needs the same parameters: got lists of lengths "
                                 f"{[len(g) for g in groups]}")
            for g in groups:                # the from-scratch layout: plain tensors to train
                for p in g:
                    if not p.requires_grad:
                        p.requires_grad_(True)
        if not groups[0]:
            raise ValueError("the model has no trainable parameter (every one has requires_grad=False)")
        return groups

    def _setup(self) -> None:
        if self._replicas is not None:
            self._frozen = [p for p in self._replicas[0].parameters() if not p.requires_grad]
            self._groups = [[p for p in m.parameters() if p.requires_grad] for m in self._replicas]
            if not self._groups[0]:
                raise ValueError("the model has no trainable parameter (every one has requires_grad=False)")
        plan = OptimizerPlan.resolve(self._spec, self._optimizer_params, self._groups[0])
        keep = plan.managed()
        if len(keep) < len(self._groups[0]):        # trainable, but not given to the optimizer
            self._groups = [[g[j] for j in keep] for g in self._groups]
            plan = plan.restricted(keep)
        # Listed once: walking the modules for them took ~80 us a step.
        self._buffers = list(self._replicas[0].buffers()) if self._replicas is not None else []
        if isinstance(self.kvstore, DistKVStore):
            self.kvstore.setup_groups(self._groups, self._frozen + self._buffers)
            self._broadcast_buffers()
        else:
            self.kvstore.setup(self._groups[0])
        self._optimizers, self._origins = [], []
        for i, g in enumerate(self._groups):
            mine = self.kvstore.optimized(i)
            indices = range(len(g)) if mine is None else mine
            optimizer, origin = plan.build([g[j] for j in indices], indices)
            self._optimizers.append(optimizer)
            self._origins.append(origin)
        self.optimizer = ReplicatedOptimizer(plan, self._groups[0], self._groups)

    def _ready(self) -> None:
        if not self._optimizers:
            self._setup()

    @property
    def learning_rate(self) -> float:
        """The learning rate of the first parameter group."""
        self._ready()
        return float(self.optimizer.param_groups[0]["lr"])

    def set_learning_rate(self, lr: float) -> None:
        """Set every parameter group's learning rate from the next step on (0 is allowed)."""
        lr = check_learning_rate(lr)
        self._ready()
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, batch_size: Denominator, ignore_stale_grad: bool = False, skip_nonfinite: bool = False) -> bool:
        """Sum gradients over devices, divide by ``batch_size``, update every replica.

        ``batch_size``: this process's number of samples (with several processes the
        processes' numbers are summed), or any divisor of the summed gradient (a float, a
        0-d tensor, a function giving one once the gradients are computed), or None for no
        division. ``skip_nonfinite``: if any gradient, on any
        device of any process, is NaN or infinite, update nothing, clear the gradients and
        return False (as AMP's grad scaler skips a step); every process decides alike.
        Returns whether it updated.
        """
        self._check_denominator(batch_size)
        self._ready()
        if skip_nonfinite and self.collective.world_size == 1 and not self._grads_finite():
            self._clear_grads()
            return False
        active = self._active(ignore_stale_grad)
        self.optimizer.push(zip(self._optimizers, self._origins))
        self.kvstore.ignore_stale_grad = ignore_stale_grad
        self.kvstore.check_finite = skip_nonfinite      # several processes: on the summed gradients
        try:
            self.kvstore.step(self._groups, active, batch_size, self._optimizers)
        finally:
            self.kvstore.check_finite = False
        return self._finish_step()

    def step_with(self, compute: Callable[[int], T], batch_size: Denominator,
                  ignore_stale_grad: bool = False, skip_nonfinite: bool = False,
                  extras: Optional[torch.Tensor] = None) -> List[T]:
        """Run ``compute(i)`` (forward and backward of shard ``i``) on every device, then ``step``.

        The same result as calling ``compute`` on every device and then ``step``, but each
        device thread goes on from its backward straight into the step's phases, meeting
        the others at a barrier, instead of returning to the caller between phases
        (measured: GluonLeNet steps on 2 CPU devices 7% faster). With several processes the
        gradients are sent in buckets while backward runs, and ``batch_size`` (this
        process's) rides in the last bucket, with ``extras`` (a few numbers to sum over the
        processes: their sum is then ``self.summed_extras``, None if they could not ride).
        ``self.stepped`` tells whether it updated.
        """
        self._check_denominator(batch_size)
        if not self._optimizers:      # the first step (lazy modules): the plain way
            out = self.runner.map(lambda i: compute(i))
            self.step(batch_size, ignore_stale_grad, skip_nonfinite)
            self.summed_extras = extras if self.collective.world_size == 1 else None
            return out
        self.optimizer.push(zip(self._optimizers, self._origins))
        self.kvstore.prepare(None if callable(batch_size) else batch_size, extras)
        self.kvstore.ignore_stale_grad = ignore_stale_grad
        self.kvstore.check_finite = skip_nonfinite
        phases = self.kvstore.phases(self._groups, batch_size, self._optimizers)
        barrier = threading.Barrier(len(self.devices)) if len(self.devices) > 1 else _NoBarrier()
        local_check = skip_nonfinite and self.collective.world_size == 1
        shared: Dict[str, Any] = {}

        def work(i: int):
            try:
                out = compute(i)
                barrier.wait()
                if local_check:       # one process: decide on the local gradients, once
                    if i == 0:
                        shared["skip"] = not self._grads_finite()
                    barrier.wait()
                    if shared["skip"]:
                        self._clear_grads(i)
                        return out, None
                active = self._active(ignore_stale_grad)   # every device computes the same
                for phase in phases:
                    with trace.span(getattr(phase, "__name__", "phase"), i):
                        phase(i, active)
                    barrier.wait()
                return out, None
            except threading.BrokenBarrierError as e:      # another device failed first
                return None, e
            except BaseException as e:
                barrier.abort()
                return None, e
        try:
            results = self.runner.map(work)
        finally:
            self.kvstore.check_finite = False
        errors = [e for _, e in results if e is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        if shared.get("skip"):
            self.stepped = False
        else:
            self._finish_step()
        self.summed_extras = self.kvstore.summed_extras
        return [out for out, _ in results]

    stepped = True      # whether the last step updated the parameters
    summed_extras: Optional[torch.Tensor] = None    # see step_with

    def _finish_step(self) -> bool:
        self.stepped = not self.kvstore.skipped
        self._broadcast_buffers()
        if self.stepped:
            self.optimizer.step()      # marks the step for lr schedulers
        return self.stepped

    def _grads_finite(self) -> bool:
        grads = [p.grad for group in self._groups for p in group if p.grad is not None]
        return all(bool(torch.isfinite(g).all()) for g in grads)

    def _clear_grads(self, device_index: Optional[int] = None) -> None:
        groups = self._groups if device_index is None else [self._groups[device_index]]
        for group in groups:
            for p in group:
                p.grad = None

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: backward passes in this block send nothing.

        >>> with trainer.no_sync():
        ...     replicas.forward_backward(Xs1, ys1)      # micro-batch 1: kept local
        >>> replicas.forward_backward(Xs2, ys2)          # micro-batch 2: sums both, sends
        >>> trainer.step(len1 + len2)
        """
        self._ready()
        reducer = getattr(self.kvstore, "reducer", None)
        if reducer is None:
            yield
            return
        with reducer.no_sync():
            yield

    def discard_gradients(self) -> None:
        """Forget the gradients accumulated since the last step (e.g. by a warm-up)."""
        self._ready()
        reducer = getattr(self.kvstore, "reducer", None)
        if reducer is not None and reducer.views:
            reducer.reset()             # the gradients are the buckets: zero them in place
            return
        self._clear_grads()

    def close(self) -> None:
        """Detach from the parameters: the gradient hooks go, so the model trains on its own
        (or in another Trainer) afterwards. The Trainer cannot step after this."""
        self.kvstore.close()

    @property
    def world_size(self) -> int:
        return self.collective.world_size

    def _check_denominator(self, batch_size: Denominator) -> None:
        if batch_size is None or isinstance(batch_size, torch.Tensor) or callable(batch_size):
            return
        # With several processes, one may have no sample in a last, small batch.
        least = 0 if self.collective.world_size > 1 else 1
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, float)) or not batch_size >= least \
                or batch_size == float("inf"):
            raise ValueError(f"step needs the batch size (a number >= {least}), got {batch_size!r}")

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
        source = self._buffers
        if not source or (len(self.devices) == 1 and self.collective.world_size == 1):
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
        """The optimizer state per parameter (by its index among the trainable ones) and the
        parameter groups' hyper-parameters; the same layout whatever the devices, kvstore or
        processes (see ``optim.optimizer_state``)."""
        self._ready()
        return optimizer_state(self._optimizers, self._groups, self.kvstore.optimized, self.optimizer)

    def load_state_dict(self, state: dict) -> None:
        """Load a ``state_dict``, whatever devices, kvstore or processes saved it."""
        self._ready()
        load_optimizer_state(state, self._optimizers, self._groups, self.optimizer)
        self.optimizer.push(zip(self._optimizers, self._origins))

    def _name(self, j: int) -> str:
        if self._replicas is not None:
            names = [n for n, p in self._replicas[0].named_parameters() if any(p is q for q in self._groups[0])]
            return repr(names[j])
        return f"#{j} (shape {tuple(self._groups[0][j].shape)})"
