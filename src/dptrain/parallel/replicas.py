"""A model replicated on a list of devices: one module per device, identical parameters.

``replicas[0]`` is the module the user passed in (moved to ``devices[0]``), so it keeps
working and ends up trained; the others are deep copies. Lazy modules are materialised by
their first batch on ``devices[0]`` and only then copied, so every replica starts equal.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import UninitializedParameter

from ..core.devices import DeviceLike, check_devices, format_device, format_devices
from ..core.modes import evaluating
from ..core.runner import get_runner
from ..distributed.collective import get_collective
from .syncbn import ThreadGroup, convert_sync_batchnorm, restore_batchnorm, synchronized

Init = Callable[[nn.Module], None]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class NotInitializedError(RuntimeError):
    """A parameter was read before a lazy module had seen its first batch."""


def sum_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the shard; ``Trainer.step(batch_size)`` divides by the batch.

    Labels must be class indices: float targets (regression values) would be read as class
    probabilities and give a loss of 0 that trains nothing, so they are an error here."""
    if y.is_floating_point() or logits.dim() < 2 or logits.shape[1] < 2:
        raise ValueError(f"the default loss is cross-entropy over class indices; got {y.dtype} targets of shape "
                         f"{tuple(y.shape)} for outputs of shape {tuple(logits.shape)}: pass integer labels, or "
                         f"your loss, e.g. forward_backward(Xs, ys, loss=lambda out, y: F.mse_loss(out, y, "
                         f"reduction='sum'))")
    return F.cross_entropy(logits, y, reduction="sum")


def is_lazy(net: nn.Module) -> bool:
    """Whether ``net`` has lazy parameters its first batch has not shaped yet."""
    return any(isinstance(p, UninitializedParameter) for p in net.parameters())


def _already_on(net: nn.Module, device: torch.device) -> bool:
    """Whether every tensor of ``net`` is on ``device`` (a CPU tensor on any ``cpu:N``): then
    ``net.to(device)`` is not called, which copies every tensor anew for "cpu:0" from "cpu"
    (and a model predicted with in a callback would lose its gradients' ties to the run's)."""
    return all(t.device.type == device.type and (device.type == "cpu" or t.device == device)
               for t in (*net.parameters(), *net.buffers()))


def copied(net: nn.Module) -> nn.Module:
    """A deep copy of ``net`` for another device; a ``TypeError`` naming the attribute that
    cannot be copied (a lock, an open file, a client of a service) and the fixes, if one cannot.

    A tensor computed from parameters and kept as a module attribute (``torch.nn.utils.prune``'s
    ``weight``, the ``weight_orig * weight_mask`` its forward pre-hook makes; the old
    ``weight_norm``'s) is not a leaf, which ``copy.deepcopy`` refuses: the copy gets it detached,
    and its hook computes it from the copy's own parameters at the copy's first forward."""
    derived = {id(value): value.detach().clone() for module in net.modules() for value in vars(module).values()
               if isinstance(value, torch.Tensor) and value.grad_fn is not None}
    try:
        return copy.deepcopy(net, derived)
    except Exception as e:      # noqa: BLE001 - named below, with the fix
        where = next((f"{name + '.' if name else ''}{key}" for name, module in net.named_modules()
                      for key, value in vars(module).items() if not key.startswith("_") and not _copies(value)),
                     None)
        raise TypeError(f"the model cannot be copied for each device ({type(e).__name__}: {e}"
                        f"{f'; attribute {where!r}' if where else ''}): dptrain trains a copy.deepcopy of it on "
                        f"every device after the first; keep such objects out of the module (pass them to forward, "
                        f"or keep them global), give its class a __deepcopy__, or train on one device "
                        f"(devices='cpu:0', or one GPU)") from e


def _copies(value: Any) -> bool:
    try:
        copy.deepcopy(value)
        return True
    except Exception:       # noqa: BLE001 - any failure is the answer
        return False


def copy_parameter_extras(net: nn.Module, copy_: nn.Module) -> None:
    """What a deep copy of a parameter loses, given to ``copy_``'s: the hooks ``net``'s
    parameters run on their gradients (``p.register_hook(fn)``: a mask of pruned weights; a
    device without them would add an unmasked gradient to the sum; and those run once the
    gradient is accumulated, ``p.register_post_accumulate_grad_hook(fn)``), and the attributes set
    on them (``p.no_weight_decay = True``, read by an optimizer of one's own; tensors moved to
    the copy's device)."""
    for p, q in zip(net.parameters(), copy_.parameters()):
        for hook in (getattr(p, "_backward_hooks", None) or {}).values():
            q.register_hook(hook)
        for hook in (getattr(p, "_post_accumulate_grad_hooks", None) or {}).values():
            q.register_post_accumulate_grad_hook(hook)
        for key, value in vars(p).items():
            if key not in vars(q):
                value = copy.deepcopy(value)
                setattr(q, key, value.to(q.device) if isinstance(value, torch.Tensor) else value)


class ReplicatedParameter:
    """One parameter of a replicated model, with its copy on every device."""

    def __init__(self, name: str, owner: "Replicas"):
        self.name, self._owner = name, owner

    def list_devices(self) -> List[torch.device]:
        return list(self._owner.devices)

    def _on(self, device: Optional[DeviceLike]) -> torch.Tensor:
        owner = self._owner
        if not owner.initialized:
            raise NotInitializedError(
                f"parameter {self.name!r} is not initialised yet: the model has lazy layers; "
                f"run one batch first (replicas.forward(split_and_load(X, devices)))")
        devices = owner.devices
        if device is None:
            if len(devices) > 1:
                raise ValueError(f"parameter {self.name!r} lives on {format_devices(devices)}: "
                                 f"name one, e.g. .data({format_device(devices[0])})")
            device = devices[0]
        device = check_devices([device])[0]
        if device not in devices:
            raise ValueError(f"parameter {self.name!r} is not on {format_device(device)}; it lives "
                             f"on {format_devices(devices)}")
        return dict(owner[devices.index(device)].named_parameters())[self.name]

    def data(self, device: Optional[DeviceLike] = None) -> torch.Tensor:
        """The value on ``device`` (which may be left out with a single device; a device listed
        twice gives its first replica's: they are equal)."""
        return self._on(device).detach()

    def grad(self, device: Optional[DeviceLike] = None) -> Optional[torch.Tensor]:
        return self._on(device).grad

    def __repr__(self) -> str:
        return f"ReplicatedParameter({self.name!r}, devices={format_devices(self._owner.devices)})"


class Replicas(Sequence[nn.Module]):
    """``replicas[i]`` is the model on ``devices[i]``; see ``replicate``."""

    def __init__(self, net: nn.Module, devices: Sequence[DeviceLike], init: Optional[Init] = None,
                 sync_batchnorm: bool = False):
        if not isinstance(net, nn.Module):
            raise TypeError(f"replicate needs an nn.Module, got {type(net).__name__}")
        if init is not None and not callable(init):
            raise TypeError(f"init must be a function of the module (e.g. dptrain.models.init_normal), got "
                            f"{type(init).__name__}")
        self.devices = check_devices(devices)
        self.runner = get_runner(self.devices)
        self._net, self._init, self.sync_batchnorm = net, init, sync_batchnorm
        #: The synchronised BatchNorm layers' exchange (``syncbn.ThreadGroup``), once made.
        self.sync_group: Optional[ThreadGroup] = None
        self._modules: List[nn.Module] = []
        if not is_lazy(net):
            self._materialize()

    @property
    def initialized(self) -> bool:
        return bool(self._modules)

    def _materialize(self, example: Any = None, run: Optional[Callable[[nn.Module, Any], Any]] = None) -> None:
        net = self._net if _already_on(self._net, self.devices[0]) else self._net.to(self.devices[0])
        if example is not None:       # lazy layers learn their shapes; BN statistics untouched
            with evaluating(net), torch.no_grad():
                if run is None:
                    net(example[:1].to(self.devices[0]))
                else:
                    run(net, example)
        if self._init is not None:
            self._init(net)
        self._modules = [net] + [copied(net).to(d) for d in self.devices[1:]]
        for copy_ in self._modules[1:]:
            copy_parameter_extras(net, copy_)
        if self.sync_batchnorm:
            self.sync_group = convert_sync_batchnorm(self._modules, get_collective(new_group=True))

    def __getitem__(self, i):
        if not self.initialized:
            raise NotInitializedError("the model has lazy layers: run one batch first "
                                      "(replicas.forward(split_and_load(X, devices)))")
        return self._modules[i]

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self[i] for i in range(len(self)))

    def named_parameters(self) -> Dict[str, ReplicatedParameter]:
        """Every parameter by its ``named_parameters`` name, in registration order."""
        return {name: ReplicatedParameter(name, self) for name, _ in self[0].named_parameters()}

    def param(self, name: str) -> ReplicatedParameter:
        """The parameter called ``name`` (e.g. ``'0.weight'``); a typo lists the valid names."""
        if self.initialized and name not in dict(self[0].named_parameters()):
            names = [n for n, _ in self[0].named_parameters()]
            raise KeyError(f"no parameter {name!r}; the model has {', '.join(names[:8])}"
                           f"{', ...' if len(names) > 8 else ''}")
        return ReplicatedParameter(name, self)

    def train(self, mode: bool = True) -> "Replicas":
        for m in self:
            m.train(mode)
        return self

    def eval(self) -> "Replicas":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Replicas":
        """Set ``requires_grad`` on every replica's parameters (``nn.Module.requires_grad_``
        on each copy: setting it on ``replicas[0]`` alone leaves the other devices computing
        gradients). A GAN freezes its discriminator so during the generator's step."""
        for m in self:
            m.requires_grad_(requires_grad)
        return self

    def forward(self, shards: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Run every shard through its device's replica, all at once."""
        self._check(shards)

        def work(i: int, X: torch.Tensor) -> torch.Tensor:
            with synchronized():
                return self._modules[i](X)
        return self.runner.map(work, shards)

    __call__ = forward

    def forward_backward(self, Xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor],
                         loss: Loss = sum_cross_entropy, amp: Optional[torch.dtype] = None) -> List[torch.Tensor]:
        """Forward and backward of every shard on its device, all at once; return the losses.

        Gradients accumulate into each replica's ``.grad``; ``Trainer.step`` sums them over
        devices. The default loss is summed over the shard, so ``step(batch_size)`` gives
        the mean over the whole batch whatever the split. ``amp=torch.bfloat16`` runs the
        forward under autocast (mixed precision).
        """
        self._check(Xs)
        return self.runner.map(lambda i, X, y: self.forward_backward_one(i, X, y, loss, amp), Xs, ys)

    def forward_backward_one(self, i: int, X: torch.Tensor, y: torch.Tensor, loss: Loss = sum_cross_entropy,
                             amp: Optional[torch.dtype] = None) -> torch.Tensor:
        """Forward and backward of one shard on replica ``i``, on the calling thread.

        For use inside a function run on every device at once (``Trainer.step_with``); on
        its own, use ``forward_backward``.
        """
        if not self.initialized:
            raise NotInitializedError("the model has lazy layers: call replicas.initialize(X) (or "
                                      "forward/forward_backward) with a first batch")
        with synchronized():
            with torch.enable_grad(), torch.autocast(self.devices[i].type, dtype=amp or torch.bfloat16,
                                                     enabled=amp is not None):
                value = loss(self._modules[i](X), y)
            value.backward()
        return value.detach()

    def initialize(self, example: Any, run: Optional[Callable[[nn.Module, Any], Any]] = None) -> None:
        """Materialise lazy layers with a batch: ``run(module, example)`` on ``devices[0]``, by
        default ``module(example[:1])``. Does nothing once the replicas exist."""
        if not self.initialized:
            self._materialize(example, run)

    def close(self) -> None:
        """Give the model (replica 0) back as it was: with ``sync_batchnorm``, its own
        BatchNorm layers put back, trained (they held the same parameters and buffers all
        along). The replicas cannot train together after this."""
        if self.sync_batchnorm and self._modules:
            restore_batchnorm(self._modules[0])

    def _check(self, shards: Sequence[torch.Tensor]) -> None:
        if len(shards) != len(self.devices):
            raise ValueError(f"got {len(shards)} shards for {len(self.devices)} devices: split the "
                             f"batch with dptrain.split_and_load(X, devices)")
        self.initialize(shards[0])


def replicate(net: nn.Module, devices: Sequence[DeviceLike], init: Optional[Init] = None,
              sync_batchnorm: bool = False) -> Replicas:
    """Place a copy of ``net`` on every device; ``init(module)`` runs once, before copying.

    BatchNorm layers use per-device batch statistics, or with ``sync_batchnorm=True``
    statistics over the whole batch (N devices then compute exactly what one device does).

    >>> replicas = dptrain.replicate(resnet18(), [cpu(0), cpu(1)], init=init_normal)
    >>> replicas[1]                                   # the model on cpu:1
    >>> replicas.param("0.weight").data(cpu(1))       # equal to .data(cpu(0))
    >>> losses = replicas.forward_backward(Xs, ys)    # every device at once
    """
    return Replicas(net, devices, init, sync_batchnorm)
