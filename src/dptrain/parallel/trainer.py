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
next step is "stale" and an error, unless ``ignore_stale_grad=True``: then a parameter no
device used is not updated, and one some devices used counts zeros on the others, as one
device on the whole batch would (``fit`` always steps so: models that skip layers train as
in plain PyTorch).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import (Any, Callable, Collection, Dict, Generic, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import torch
from torch import nn

from ..core.devices import DeviceLike
from ..core.runner import get_runner
from ..distributed.collective import get_collective
from . import sync
from .params import devices_of, parameter_lists
from .combined import CombinedOptimizer
from .layout import Layout
from .local_step import local_step
from .optim import OptimizerSpec, check_learning_rate, check_optimizer
from .replicated_optimizer import ReplicatedOptimizer
from .optim_state import load_optimizer_state, optimizer_state
from .phases import run_fused
from .replicas import Replicas
from .step_checks import active_parameters, check_denominator
from .step_traits import closure_error, step_traits
from .trainable import NEW_TRAINER, agree
from .update_report import UpdateReport
from .sync import Denominator, GradientSync, SyncStep
from .sync.base import Extras
from .sync.grad_ops import unscale_and_check_
from .sync.buckets import DEFAULT_BUCKET_MB

T = TypeVar("T")
Params = Union[Replicas, nn.Module, Sequence[torch.Tensor], Sequence[Sequence[torch.Tensor]]]


@dataclass
class StepOutcome(Generic[T]):
    """What ``Trainer.step_with`` did: each device's ``compute`` output, whether it updated
    the parameters, and the processes' sum of the ``extras`` (None if they could not ride)."""
    outputs: List[T]
    stepped: bool
    summed_extras: Extras = None
    grad_norm: Optional[torch.Tensor] = None        # before clipping (with max_norm)


class Trainer:
    """Update model replicas with summed gradients; see the module docstring for the loop.

    ``params_or_replicas``: a ``Replicas``; one ``nn.Module`` or parameter list (one device);
    or one parameter list per device (the from-scratch layout), with ``devices`` naming them.
    ``optimizer``: a name (``"sgd"``, ``"nag"``, ``"adam"``, ``"adamw"``) with
    ``optimizer_params``, a ``torch.optim`` class or factory (``torch.optim.AdamW``,
    ``functools.partial(torch.optim.SGD, lr=0.1)``), or an optimizer built on the model;
    several on one loss, each built on its parameters: ``{name: optimizer}`` or a list (a
    ``CombinedOptimizer``).
    """

    def __init__(self, params_or_replicas: Params, optimizer: OptimizerSpec = "sgd",
                 optimizer_params: Optional[Mapping[str, Any]] = None,
                 kvstore: Optional[str] = "device", devices: Optional[Sequence[DeviceLike]] = None,
                 bucket_cap_mb: float = DEFAULT_BUCKET_MB, closure: bool = False):
        if isinstance(optimizer, str):
            check_optimizer(optimizer, optimizer_params)          # a typo fails here, not at step 1
        elif isinstance(optimizer, (dict, list, tuple)):        # several on one loss: stepped as one
            optimizer = CombinedOptimizer(optimizer)
        self._spec, self._optimizer_params = optimizer, optimizer_params
        self._kvstore, self._bucket_cap_mb, self._growable = kvstore, bucket_cap_mb, False
        self._closure = closure     # an optimizer needing a closure is stepped by engine/closure_step.py
        #: Whether the optimizer's ``step`` needs a closure (``torch.optim.LBFGS``): stepped by
        #: ``fit`` with one (``engine/closure_step.py``), never by ``step``. Known once set up.
        self.needs_closure = False
        #: A closure it calls after a backward (Sharpness-Aware Minimization), not instead of one.
        self.closure_after_backward = False
        self._given: Optional[List[List[torch.Tensor]]] = None
        self._given_frozen: List[torch.Tensor] = []
        if isinstance(params_or_replicas, Replicas):
            self.devices = params_or_replicas.devices
            self._replicas: Optional[Replicas] = params_or_replicas
        else:
            self._replicas = None
            self._given, self._given_frozen = parameter_lists(params_or_replicas)
            self.devices = devices_of(self._given, devices)
        self.runner = get_runner(self.devices)
        self.collective = get_collective()
        self.sync: GradientSync = sync.create(kvstore, self.runner, self.collective, bucket_cap_mb)
        self.layout: Optional[Layout] = None        # what trains, and the per-device optimizers
        self.optimizer: Optional[ReplicatedOptimizer] = None
        #: The last update's per-parameter norms and gradients, when asked for
        #: (``norms_by_parameter``, ``keep_grads``; ``update_report.py``).
        self.report = UpdateReport()
        if self._replicas is None or self._replicas.initialized:
            # Now, before any backward: several processes start from rank 0's parameters.
            self._setup()

    def _setup(self) -> None:
        self.layout = Layout(self._replicas, self._given, self._given_frozen, self._spec, self._optimizer_params)
        traits = step_traits(self.layout.plan, len(self.layout.params))
        self.needs_closure = traits.closure is not None
        self.closure_after_backward = traits.closure == "after_backward"
        if self.needs_closure and not self._closure:
            raise closure_error(self.layout.plan.cls.__name__)
        if traits.whole and isinstance(self.sync, sync.OwnerDeviceSync):     # (every device updates all)
            self._kvstore = "local"
            self._fresh_sync()
        self.optimizer = self.layout.optimizer
        self.optimizer.growable = self._growable
        self.layout.build(self.sync)
        self._broadcast_buffers()
        self.layout.lend(range(len(self.layout.kept)))      # an optimizer object that trained before goes on

    # The layout's lists, as the steps read them.
    @property
    def _groups(self) -> List[List[torch.Tensor]]:
        return self.layout.groups

    @property
    def _optimizers(self) -> List[torch.optim.Optimizer]:
        return self.layout.optimizers if self.layout is not None else []

    @property
    def _origins(self) -> List[List[int]]:
        return self.layout.origins

    def follow_edits(self) -> None:
        """Take what ``fit``'s callbacks change between steps (``follow``): layers unfrozen,
        groups added to ``optimizer``. A Trainer of the user's own loop refuses them."""
        self._growable = True
        if self.optimizer is not None:
            self.optimizer.growable = True

    def follow(self, trainable_changed: bool = True, others: Collection[int] = ()) -> bool:
        """Between steps, after user code ran: if a parameter now trains that the per-device
        optimizers do not hold (unfrozen, or in a group added to ``optimizer``), build them
        and the gradient sync again for what trains now, keeping every optimizer state (the
        new parameters start with none, as in a plain loop; ``layout.py``). Returns whether it
        rebuilt. A ValueError if it cannot: a layer unfrozen that no group holds (nor another
        optimizer of the run, which updates ``others``), or processes that disagree on what
        trains."""
        plan = self.layout.regrouped(trainable_changed, others) if self.layout is not None else None
        if plan is None:
            return False
        agree(self.collective, [p.requires_grad for p in self.layout.params], plan)
        self.layout.rebuild(plan, self._fresh_sync())
        self._broadcast_buffers()
        return True

    def _fresh_sync(self) -> GradientSync:
        self.sync.close()
        self.sync = sync.create(self._kvstore, self.runner, self.collective, self._bucket_cap_mb)
        return self.sync

    def _ready(self) -> None:
        if self.layout is None:
            self._setup()

    @property
    def learning_rate(self) -> float:
        """The learning rate of the first parameter group (NaN where it is None: an optimizer
        that finds its own, as Adafactor's relative step)."""
        self._ready()
        return _rate(self.optimizer.param_groups[0]["lr"])

    @property
    def learning_rates(self) -> Optional[Dict[str, float]]:
        """With a ``CombinedOptimizer``: each of its optimizers' learning rate (its first
        group's), by name; None with one optimizer (``learning_rate`` is all there is)."""
        self._ready()
        firsts = getattr(self.layout.plan, "first_groups", None)
        return None if firsts is None else {name: _rate(self.optimizer.param_groups[g]["lr"])
                                            for name, g in firsts.items()}

    def set_learning_rate(self, lr: float) -> None:
        """Set every parameter group's learning rate from the next step on (0 is allowed)."""
        lr = check_learning_rate(lr)
        self._ready()
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, batch_size: Denominator, ignore_stale_grad: bool = False, skip_nonfinite: bool = False,
             max_norm: Optional[float] = None, max_value: Optional[float] = None) -> bool:
        """Sum gradients over devices, divide by ``batch_size``, update every replica.

        ``batch_size``: this process's number of samples (with several processes the
        processes' numbers are summed), or any divisor of the summed gradient (a float, a
        0-d tensor, a function giving one once the gradients are computed), or None for no
        division. ``skip_nonfinite``: if any gradient, on any
        device of any process, is NaN or infinite, update nothing, clear the gradients and
        return False (as AMP's grad scaler skips a step); every process decides alike.
        ``max_norm``: clip the summed gradient to this norm (over every parameter, device and
        process, as ``clip_grad_norm_`` on one device); ``max_value``: then clip each element
        of it to ``[-max_value, max_value]`` (``clip_grad_value_``). Returns whether it updated.
        """
        self._check_denominator(batch_size)
        self._ready()
        self.report.clear()
        if self.layout.trainable is not None:
            self.layout.trainable.check("between two Trainer.step calls", NEW_TRAINER)
        if skip_nonfinite and self.collective.world_size == 1 and not self._grads_finite():
            self._clear_grads()
            return False
        active = self._active(ignore_stale_grad)
        self.optimizer.push(zip(self._optimizers, self._origins))
        # several processes: checked on the summed gradients (the buckets were sent in backward)
        step = self.report.request(batch_size, ignore_stale_grad=ignore_stale_grad, check_finite=skip_nonfinite,
                                   max_norm=max_norm, max_value=max_value)
        self.sync.step(self._groups, active, step, self._optimizers)
        return self._finish_step(step)

    def step_with(self, compute: Callable[[int], T], batch_size: Denominator,
                  ignore_stale_grad: bool = False, skip_nonfinite: bool = False,
                  extras: Extras = None, max_norm: Optional[float] = None,
                  max_value: Optional[float] = None) -> StepOutcome[T]:
        """Run ``compute(i)`` (forward and backward of shard ``i``) on every device, then ``step``.

        The same result as calling ``compute`` on every device and then ``step``, in one
        dispatch to the device threads (``phases.py``). With several processes the gradients
        are sent in buckets while backward runs, and ``batch_size`` (this process's) rides in
        the last bucket, with ``extras`` (a few numbers to sum over the processes: a tensor, or
        Python numbers, which cost no operation of their own). Returns the outputs, whether it
        updated, and the summed extras, as a ``StepOutcome``.
        """
        self._check_denominator(batch_size)
        if self.layout is None:      # the first step (lazy modules): the plain way
            outputs = self.runner.map(lambda i: compute(i))
            stepped = self.step(batch_size, ignore_stale_grad, skip_nonfinite, max_norm, max_value)
            return StepOutcome(outputs, stepped, extras if self.collective.world_size == 1 else None)
        self.optimizer.push(zip(self._optimizers, self._origins))
        step = self.report.request(batch_size, extras, ignore_stale_grad=ignore_stale_grad,
                                   check_finite=skip_nonfinite, max_norm=max_norm, max_value=max_value)
        self.sync.prepare(step)
        phases = self.sync.phases(self._groups, step, self._optimizers)
        local_check = skip_nonfinite and self.collective.world_size == 1
        outputs, skipped = run_fused(self.runner, compute, phases, lambda: self._active(ignore_stale_grad),
                                     self._grads_finite if local_check else None, self._clear_grads)
        if skipped:
            self.report.clear()
        stepped = False if skipped else self._finish_step(step)
        return StepOutcome(outputs, stepped, step.summed_extras, step.grad_norm)

    @property
    def alone(self) -> bool:
        """One device of one process with nothing to sum (``local_step`` applies), once the
        optimizer is built (after the first step of a model with lazy layers)."""
        return self.layout is not None and type(self.sync) is GradientSync and self.collective.world_size == 1

    def local_step(self, skip_nonfinite: bool = False, max_norm: Optional[float] = None,
                   max_value: Optional[float] = None, loss_scale: Optional[float] = None) -> Tuple[bool, Optional[torch.Tensor]]:
        """Update on the gradients backward left, as they are (already the step's: one
        device, one process, a mean loss; see ``alone``): as a plain loop's
        ``optimizer.step(); optimizer.zero_grad()``, with ``step``'s NaN check and clipping;
        ``loss_scale``: what the loss was multiplied by (float16), divided out first.
        Returns whether it updated and the norm before clipping (with ``max_norm``)."""
        return local_step(self._groups[0], self._optimizers[0], self.optimizer, self._origins[0], self.devices[0],
                          self.report, skip_nonfinite, max_norm, max_value, loss_scale)

    @property
    def norms_by_parameter(self) -> bool:
        """With ``max_norm`` (``math.inf`` clips nothing), keep each parameter's norm too:
        ``grad_norms()`` gives the last update's."""
        return self.report.norms_by_parameter

    @norms_by_parameter.setter
    def norms_by_parameter(self, keep: bool) -> None:
        self.report.norms_by_parameter = keep

    @property
    def keep_grads(self) -> bool:
        """Keep a copy of each update's summed, divided gradients, before clipping:
        ``take_grads()`` gives the last update's (``fit``'s ``on_gradients`` callbacks)."""
        return self.report.keep_grads

    @keep_grads.setter
    def keep_grads(self, keep: bool) -> None:
        self.report.keep_grads = keep

    def _finish_step(self, step: SyncStep) -> bool:
        self._broadcast_buffers()
        self.report.read(step)
        if not step.skipped:
            self.optimizer.step()      # marks the step for lr schedulers
        return not step.skipped

    def grad_norms(self) -> Dict[str, float]:
        """Each trainable parameter's gradient norm in the last update, by name (``#j`` for
        a parameter list's ``j``-th), in the model's order: the summed and divided gradient's,
        before clipping, whose norm together is the ``grad_norm`` of that update. Kept with
        ``norms_by_parameter = True`` by the updates given a ``max_norm`` (``math.inf``
        clips nothing); empty otherwise, and after a skipped update. Waits for the devices."""
        return self.report.grad_norms(self.layout.names()) if self.layout is not None else {}

    def take_grads(self) -> Dict[str, torch.Tensor]:
        """The last update's gradients, by name as ``grad_norms`` (the summed gradient over
        every device and process, divided as the loss's mean is, before clipping: what
        ``p.grad`` holds before ``clip_grad_norm_`` and ``optimizer.step()`` in a plain loop
        on the whole batch), each on the first device; then forgotten (its memory freed). Kept
        with ``keep_grads = True``; empty otherwise, and after a skipped update."""
        if not self.report.holds_grads:
            return {}
        return self.report.take_grads(self.layout.names(), self.devices[0])

    def _grads_finite(self) -> bool:
        # One fused check and one wait per device (a wait per parameter took a GPU's lead away).
        return not unscale_and_check_([p for group in self._groups for p in group], 1.0)

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
        with self.sync.no_sync():
            yield

    def discard_gradients(self) -> None:
        """Forget the gradients accumulated since the last step (e.g. by a warm-up)."""
        self._ready()
        self.sync.discard(self._groups)

    def close(self) -> None:
        """Detach from the parameters: the gradient hooks go, so the model trains on its own
        (or in another Trainer) afterwards, and an optimizer object it was given gets its state
        back (``give_back``). The Trainer cannot step after this."""
        self.sync.close()
        self.give_back()

    @property
    def optimizer_name(self) -> str:
        """The class name of the optimizer every device runs (``SGD``, ``AdamW``...;
        ``Muon+AdamW`` for a ``CombinedOptimizer``)."""
        self._ready()
        return self.optimizer.label

    @property
    def kvstore(self) -> GradientSync:
        """The gradient-sync strategy (named ``kvstore`` as in Gluon)."""
        return self.sync

    @property
    def world_size(self) -> int:
        return self.collective.world_size

    def _check_denominator(self, batch_size: Denominator) -> None:
        check_denominator(batch_size, self.collective.world_size > 1)

    def _active(self, ignore_stale_grad: bool) -> List[int]:
        return active_parameters(self._groups, ignore_stale_grad, self.devices, self._name)

    def _broadcast_buffers(self) -> None:
        self.layout.broadcast_buffers(self.runner, self.collective)

    def state_dict(self) -> dict:
        """The optimizer state per parameter (by its index among the trainable ones) and the
        parameter groups' hyper-parameters; the same layout whatever the devices, kvstore or
        processes (see ``optim_state.py``). With a model: which of its parameters train and
        each group's members (by index among them all), which a callback may have changed."""
        self._ready()
        state = optimizer_state(self._optimizers, self._groups, self.sync.optimized, self.optimizer)
        return {**state, **self.layout.trains()}

    def give_back(self) -> None:
        """Into the optimizer the user built on the model, if one was given: the state and
        hyper-parameters training reached, so that it goes on from there (a second ``fit``, a
        loop of the user's, its ``state_dict``), as the optimizer of a plain loop would, with
        the groups a callback added. Its state was lent to this Trainer when it was set up
        (held once, not twice): ``close`` gives it back, as the end of ``fit`` does."""
        if isinstance(self._spec, torch.optim.Optimizer) and self.layout is not None:
            self.layout.give_back(self.state_dict())

    def load_state_dict(self, state: dict) -> None:
        """Load a ``state_dict``, whatever devices, kvstore or processes saved it (and what
        trained then: unfrozen layers, added groups)."""
        self._ready()
        if self.layout.restore(state, self._fresh_sync):
            self._broadcast_buffers()
        load_optimizer_state(state, self._optimizers, self._groups, self.optimizer)
        self.optimizer.push(zip(self._optimizers, self._origins))

    def _name(self, j: int) -> str:
        if self._replicas is not None:
            return repr(self.layout.names()[j])
        return f"#{j} (shape {tuple(self._groups[0][j].shape)})"


def _rate(lr: Any) -> float:
    return math.nan if lr is None else float(lr)
