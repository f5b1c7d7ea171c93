"""Several optimizers over parts of one model, taking turns on every batch: ``Trainers``.

A GAN's discriminator and generator, an actor and a critic: each optimizer holds its own
parameters of one module (built on ``model.discriminator.parameters()``...), and each batch
runs one update per optimizer, in order, each on a loss of its own. ``Trainers`` holds one
``Trainer`` per optimizer, all on the same ``Replicas``, and during an update lets only that
optimizer's parameters require gradients, on every replica (Lightning's
``toggle_optimizer``): the others compute no gradient and send none, and none is left over
to count in their next update. That is the plain loop's result, whose
``opt_d.zero_grad()`` before each update throws those gradients away.

It offers what a run with several optimizers asks of its ``Trainer`` (state for checkpoints,
learning rates, what callbacks change, closing), each by update where one is not enough; the
settings that would ask more are refused before (``engine/updates.py``).

>>> trainers = Trainers(replicas, {"d": torch.optim.Adam(gan.d.parameters()), "g": ...})
>>> with trainers.toggled("d") as trainer:
...     trainer.step_with(compute, n)
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Set

import torch

from .replicas import Replicas
from .sync.buckets import DEFAULT_BUCKET_MB
from .trainer import Trainer


def check_optimizers(optimizers: Mapping[str, Any], model: torch.nn.Module) -> None:
    """A ``ValueError`` or ``TypeError`` unless ``optimizers`` is ``{name: optimizer built on
    model's parameters}``, no parameter in two of them."""
    where = {id(p): name for name, p in model.named_parameters()}
    owner: Dict[int, str] = {}
    for key, optimizer in optimizers.items():
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer[{key!r}] must be an optimizer built on the parameters it updates, e.g. "
                            f"torch.optim.Adam(model.generator.parameters(), lr=2e-4), got {type(optimizer).__name__}"
                            f" (with several optimizers each names its parameters)")
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in where:
                    raise ValueError(f"optimizer[{key!r}] holds a parameter of shape {tuple(p.shape)} that is not "
                                     f"the model's: build it on the parameters of the model given to fit")
                if owner.setdefault(id(p), key) != key:
                    raise ValueError(f"the parameter {where[id(p)]!r} is in optimizer[{owner[id(p)]!r}] and "
                                     f"optimizer[{key!r}]: each parameter is updated by one optimizer")


class Trainers:
    """One ``Trainer`` per named optimizer, on the same replicas; see the module docstring."""

    def __init__(self, replicas: Replicas, optimizers: Mapping[str, torch.optim.Optimizer],
                 kvstore: Any = "device", bucket_cap_mb: float = DEFAULT_BUCKET_MB):
        check_optimizers(optimizers, replicas[0])
        self.replicas = replicas
        self.trainers: Dict[str, Trainer] = {name: Trainer(replicas, opt, kvstore=kvstore, bucket_cap_mb=bucket_cap_mb)
                                             for name, opt in optimizers.items()}
        self._given = dict(optimizers)
        self._index = {id(p): j for j, p in enumerate(replicas[0].parameters())}
        self._own: Dict[str, Set[int]] = {}
        self._find_own()

    def _find_own(self) -> None:
        """Each update's parameters, by index among the model's: its optimizer's groups (a
        callback may have added one)."""
        self._own = {name: {self._index[id(p)] for g in (t.optimizer or self._given[name]).param_groups
                            for p in g["params"] if id(p) in self._index} for name, t in self.trainers.items()}

    @property
    def names(self) -> List[str]:
        return list(self.trainers)

    @contextmanager
    def toggled(self, name: str) -> Iterator[Trainer]:
        """Within: only update ``name``'s parameters that train require gradients, on every
        replica; afterwards each parameter's ``requires_grad`` is as it was."""
        own, paused = self._own[name], []
        for m in self.replicas:
            for j, p in enumerate(m.parameters()):
                if p.requires_grad and j not in own:
                    p.requires_grad_(False)
                    paused.append(p)
        try:
            yield self.trainers[name]
        finally:
            for p in paused:
                p.requires_grad_(True)

    # -- what a run asks of its trainer ----------------------------------------------------
    @property
    def learning_rate(self) -> float:
        """The first update's optimizer's (first group's) learning rate; ``learning_rates``: each's."""
        return self._first.learning_rate

    @property
    def learning_rates(self) -> Dict[str, float]:
        return {name: t.learning_rate for name, t in self.trainers.items()}

    @property
    def optimizer(self) -> Dict[str, Any]:
        """Each update's optimizer (what schedulers attach to), by name."""
        return {name: t.optimizer for name, t in self.trainers.items()}

    @property
    def optimizer_name(self) -> str:
        return ", ".join(f"{name}: {t.optimizer_name}" for name, t in self.trainers.items())

    @property
    def norms_by_parameter(self) -> bool:
        """Keep each parameter's gradient norm in every update (``Trainer.norms_by_parameter``)."""
        return self._first.norms_by_parameter

    @norms_by_parameter.setter
    def norms_by_parameter(self, keep: bool) -> None:
        for t in self.trainers.values():
            t.norms_by_parameter = keep

    def grad_norms(self) -> Dict[str, float]:
        """Each trainable parameter's gradient norm in its optimizer's last update, by name."""
        return {name: norm for t in self.trainers.values() for name, norm in t.grad_norms().items()}

    @property
    def keep_grads(self) -> bool:
        """Keep each update's gradients (``Trainer.keep_grads``)."""
        return self._first.keep_grads

    @keep_grads.setter
    def keep_grads(self, keep: bool) -> None:
        for t in self.trainers.values():
            t.keep_grads = keep

    def take_grads(self) -> Dict[str, torch.Tensor]:
        """Each trainable parameter's gradient in its optimizer's last update (``Trainer.take_grads``),
        in the model's order."""
        grads = {name: g for t in self.trainers.values() for name, g in t.take_grads().items()}
        order = [name for name, _ in self.replicas[0].named_parameters() if name in grads]
        return {name: grads[name] for name in order + [n for n in grads if n not in set(order)]}

    def follow_edits(self) -> None:
        for t in self.trainers.values():
            t.follow_edits()

    def follow(self, trainable_changed: bool = True) -> bool:
        """A callback's change to what trains (``Trainer.follow``): each update's Trainer
        follows its own parameters (a layer unfrozen that one optimizer holds is another's
        business to the rest); a layer unfrozen that no optimizer holds is an error."""
        if not trainable_changed and not any(t.optimizer is not None and t.optimizer.group_added
                                             for t in self.trainers.values()):
            return False        # (after every callback hook: nothing to look at)
        self._find_own()
        rebuilt = [t.follow(trainable_changed, set().union(*(own for other, own in self._own.items() if other != name)))
                   for name, t in self.trainers.items()]
        return any(rebuilt)

    def state_dict(self) -> dict:
        return {"updates": {name: t.state_dict() for name, t in self.trainers.items()}}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("updates")
        if not isinstance(saved, dict) or set(saved) != set(self.trainers):
            said = f"the optimizers {sorted(saved)}" if isinstance(saved, dict) else "one optimizer"
            raise ValueError(f"the checkpoint holds {said}, this run has {sorted(self.trainers)}: resume with the "
                             f"optimizers (and step names) it was saved with")
        for name, t in self.trainers.items():
            t.load_state_dict(saved[name])

    def close(self) -> None:
        for t in self.trainers.values():
            t.close()

    @property
    def _first(self) -> Trainer:
        return next(iter(self.trainers.values()))
