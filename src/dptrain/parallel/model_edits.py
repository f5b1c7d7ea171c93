"""What the user's code does to the model between two steps, made true on every device.

``fit``'s callbacks see the user's own module (``run.model``, the first replica). A callback
that edits it (a max-norm constraint after each batch, ``run.model.load_state_dict(...)``, a
KL weight or a dropout rate scheduled by epoch, ``run.model.eval()`` to freeze BatchNorm)
changed only that copy: on several devices of one process the others trained on without it,
and the devices drifted apart, silently. So after each hook that runs user code the loop asks
``ModelEdits.after``, which makes the other replicas follow the first:

- a parameter or buffer written in place since the last step (its version counter,
  ``tensor._version``, moved) is copied to them;
- a plain attribute of a module (a number, string, bool or None: ``training``, ``p``, your
  own ``beta``) that differs from the second replica's is set on them (not those that
  differed when training started: a replica's own, as a synchronised BatchNorm's ``rank``);
- a parameter whose ``requires_grad`` changed is set so on them, and the ``Trainer`` is told
  (``Trainer.follow``: a layer unfrozen, or a group added to ``run.optimizer``, trains from
  the next step on; see ``trainable.py``).

- a hook on a parameter's gradient registered or removed (``p.register_hook(fn)``) is
  registered or removed on them, and so is a forward hook or pre-hook on a module (activation
  statistics, a layer's output kept for a loss: ``forward_hooks``, told so, then runs the
  forwards in turn);
- a change of structure (parameters, buffers or submodules added or removed: a layer pruned
  by ``torch.nn.utils.prune``) is a ValueError naming the fix (two ``fit`` calls around it).

Not seen: a write through ``param.data`` (it moves no version: use ``torch.no_grad()`` and the
parameter itself, or ``run.load_weights``), and attributes that are other objects (lists,
dicts, tensors assigned anew: assign a new ``nn.Parameter``/buffer through ``load_state_dict``).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
from torch.utils.hooks import RemovableHandle

from .replicas import Replicas
from .trainable import TrainableSet
from .trainer import Trainer

_PLAIN = (bool, int, float, str, type(None))
_MISSING = object()


class ModelEdits:
    """The first replica's tensor versions after the last step, what trains, and its modules.

    >>> edits = ModelEdits(replicas, trainer)
    >>> trainer.step(...); edits.stepped()             # the step's own writes are not edits
    >>> callbacks.on_batch_end(...); edits.after("in on_batch_end")
    """

    def __init__(self, replicas: Replicas, trainer: Optional[Trainer] = None,
                 forward_hooks_changed: Optional[Callable[[], None]] = None):
        self.trainable = TrainableSet(replicas[0])
        self._trainer = trainer
        if trainer is not None:
            trainer.follow_edits()
        self._replicas = list(replicas)
        self._tensors: List[List[torch.Tensor]] = [list(m.parameters()) + list(m.buffers()) for m in replicas]
        self._modules: List[List[Any]] = [list(m.modules()) for m in replicas]
        self._own = {(j, key) for others in self._modules[1:] for j, module in enumerate(self._modules[0])
                     for key, value in module.__dict__.items()
                     if type(value) in _PLAIN and others[j].__dict__.get(key, _MISSING) != value}
        self._first = self._tensors[0]
        self._shapes = [_structure(m) for m in self._modules[0]]
        self._params = [list(m.parameters()) for m in replicas]
        self._hooks = [_hook_keys(p) for p in self._params[0]]     # the copies have these (replicas.py)
        self._handles: dict = {}        # (parameter, hook key) -> the copies' handles of a hook added since
        self._forward = [_forward_keys(m) for m in self._modules[0]]
        self._forward_changed = forward_hooks_changed
        # torch numbers every hook handle it makes from one counter: while it stands still, nothing
        # was registered, and only the modules holding forward hooks can have lost one (a scan of
        # every module's tables took 50 us an after() on ResNet-18's 54, this VM)
        self._next_id = RemovableHandle.next_id
        self._hooked = [j for j, keys in enumerate(self._forward) if any(keys)]
        self._versions: List[int] = []
        self.stepped()

    @property
    def several(self) -> bool:
        """Whether there are other replicas to make follow the first (else ``stepped`` after
        each step is not needed)."""
        return len(self._tensors) > 1

    def stepped(self) -> None:
        """After a step (or anything of dptrain's that writes every replica alike)."""
        self._versions = [t._version for t in self._first]

    def after(self, where: str, always: bool = False) -> bool:
        """After user code ran (``where``: "in on_batch_end"): tensors written in place,
        plain attributes and ``requires_grad`` changed on the first replica are given to the
        others, and the Trainer follows what trains (an error, naming ``where``, if it cannot).
        Returns whether tensors were written (on one replica: only with ``always``, else False)."""
        changed = self.trainable.changed()
        if changed and self.several:        # layers frozen or unfrozen
            for first, *others in zip(*(list(m.parameters()) for m in self._replicas)):
                for other in others:
                    other.requires_grad_(first.requires_grad)
        if self._trainer is not None:
            try:
                self._trainer.follow(changed)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        if self.several:
            self._check_structure(where)
            self._follow_attributes()
            self._follow_hooks()
            self._follow_forward_hooks()
        elif not always:
            return False
        versions = [t._version for t in self._first]
        if versions == self._versions:
            return False
        with torch.no_grad():
            for j, (now, then) in enumerate(zip(versions, self._versions)):
                if now != then:
                    for other in self._tensors[1:]:
                        other[j].copy_(self._first[j])
        self._versions = [t._version for t in self._first]
        return True

    def _check_structure(self, where: str) -> None:
        """A ValueError if a module of the first replica gained or lost parameters, buffers or
        submodules, or changed class (pruned, parametrized, a layer added): the other copies
        were made before and would train without it, a step apart from the plain loop's."""
        for module, was in zip(self._modules[0], self._shapes):
            if _structure(module) != was:
                names = {id(m): n for n, m in self._replicas[0].named_modules()}
                name = names.get(id(module), "?") or "the model itself"
                raise ValueError(
                    f"the model's structure changed during training (seen {where}: {name!r}, a "
                    f"{type(module).__name__}, now holds other parameters, buffers or submodules, e.g. "
                    f"torch.nn.utils.prune or a parametrization applied by a callback): the copies on the other "
                    f"devices were made when training started and would train without the change; make it "
                    f"before fit, or end this fit and call fit again after it (an optimizer you built goes on "
                    f"with its state), or train on one device")

    def _follow_hooks(self) -> None:
        """Hooks on a parameter's gradient registered on the first replica since the last look
        (``p.register_hook(fn)`` in ``on_fit_start``: a mask, a noise) are registered on the
        copies, and those removed are removed there: a copy without one added its device's
        gradient unhooked to the sum."""
        for j, p in enumerate(self._params[0]):
            now = _hook_keys(p)
            if now == self._hooks[j]:
                continue
            for key in self._hooks[j]:
                if key not in now:
                    for handle in self._handles.pop((j, key), ()):
                        handle.remove()
            for key in now:
                if key not in self._hooks[j]:
                    hook = p._backward_hooks[key]
                    self._handles[(j, key)] = [params[j].register_hook(hook) for params in self._params[1:]]
            self._hooks[j] = now

    def _follow_forward_hooks(self) -> None:
        """Forward hooks and pre-hooks registered on a module of the first replica since the last
        look (in ``on_fit_start``: activation statistics, a layer's output kept for a loss) are put
        on the copies' same module, under the same key and with the same flags (``with_kwargs``,
        ``always_call``), and those removed are removed there: a copy without one ran its forward
        unhooked, so a hook counting activations saw device 0's part alone, silently."""
        registered = RemovableHandle.next_id != self._next_id
        if not registered and not self._hooked:
            return
        changed = False
        for j in range(len(self._modules[0])) if registered else self._hooked:
            module = self._modules[0][j]
            now = _forward_keys(module)
            if now == self._forward[j]:
                continue
            changed = True
            for kind, keys, was in zip(_FORWARD, now, self._forward[j]):
                hooks = getattr(module, kind)
                for others in self._modules[1:]:
                    for key in was:
                        if key not in keys:
                            for table in (kind, *_FLAGS[kind]):
                                getattr(others[j], table, {}).pop(key, None)
                    for key in keys:
                        if key not in was:
                            getattr(others[j], kind)[key] = hooks[key]
                            for flag in _FLAGS[kind]:
                                if key in getattr(module, flag, {}):
                                    getattr(others[j], flag)[key] = getattr(module, flag)[key]
            self._forward[j] = now
        self._next_id = RemovableHandle.next_id
        if changed:
            self._hooked = [j for j, keys in enumerate(self._forward) if any(keys)]
            if self._forward_changed is not None:
                self._forward_changed()

    def _follow_attributes(self) -> None:
        second = self._modules[1]
        for j, module in enumerate(self._modules[0]):
            theirs = second[j].__dict__
            for key, value in module.__dict__.items():
                if type(value) in _PLAIN:
                    was = theirs.get(key, _MISSING)
                    if was is not value and was != value and (j, key) not in self._own:
                        for others in self._modules[1:]:
                            setattr(others[j], key, value)


def _structure(module: Any) -> tuple:
    """What a structural edit of ``module`` changes: its class, the names of its own
    parameters and buffers, and its submodules (a head replaced by another is another object)."""
    return type(module), tuple(module._parameters), tuple(module._buffers), tuple(map(id, module._modules.values()))


#: A module's tables of forward hooks, and the tables of their flags (by the hook's key).
_FORWARD = ("_forward_hooks", "_forward_pre_hooks")
_FLAGS = {"_forward_hooks": ("_forward_hooks_with_kwargs", "_forward_hooks_always_called"),
          "_forward_pre_hooks": ("_forward_pre_hooks_with_kwargs",)}


def _forward_keys(module: Any) -> tuple:
    """The keys of ``module``'s forward hooks and of its pre-hooks, in order."""
    return tuple(tuple(getattr(module, kind)) for kind in _FORWARD)


def _hook_keys(p: torch.Tensor) -> tuple:
    """The ids of the hooks on ``p``'s gradient (``p.register_hook``), in order."""
    hooks = getattr(p, "_backward_hooks", None)
    return tuple(hooks) if hooks else ()
