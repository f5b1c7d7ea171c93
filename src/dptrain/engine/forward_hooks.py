"""Forward hooks of the user's on a model run on several devices of one process: their forwards
run in turn, so a hook that keeps a layer's output hands each device's step its own device's.

Every device's copy of the model calls the same hook function, and a hook keeping features
writes them where every copy writes (``feats["body"] = output``: features for an auxiliary
head, a distillation or perceptual loss; ``embeddings.append(output)`` in ``predict``). With the
forwards at once, a step read another device's features: "Trying to backward through the graph
a second time", batch sizes that do not match, tensors on another GPU, or outputs in thread
order. In turn (``step_plan.Turns``), device i's forward and loss come before device i+1's, so
its step reads its own; the backward passes still run at once. A DDP script has no such race
(a process per device, a model each).

Hooks of torch's own keep to their module (quantization's observers, the old ``weight_norm``,
``spectral_norm`` and pruning pre-hooks) and are not counted; nor are dptrain's.

    user_hooks(model)        # ['body: <lambda>', 'fc (pre): keep_input'] -> in turn on several devices
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List

from torch import nn
from torch.nn.modules import module as torch_module

OWN = ("torch.", "dptrain.")      # (modules whose hooks keep to their layer)
TURNS_ERROR = ("the model has forward hooks of yours ({hooks}): on several devices of one process their forwards "
               "run one after another, so that a hook keeping a layer's output gives each device's step its own; "
               "{waits} waits for every device inside the forward, so they cannot. Train on one device "
               "(devices=1), or as processes (a device each: dptrain launch --processes N), or without {setting}")
#: What waits for every device's forward, by its setting.
WAITS = {"sync_batchnorm": "sync_batchnorm's BatchNorm", "whole_batch": "a whole_batch loss"}


class TurnsError(ValueError):
    """Forward hooks of the user's on several devices where the forwards wait for each other."""


def _unwrapped(hook: Any) -> Any:
    """The function a hook calls (a partial's, however deep)."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    return hook


def _origin(hook: Any) -> str:
    """The module a hook's code comes from (a function's, a bound method's, a partial's, an object's class)."""
    fn = getattr(_unwrapped(hook), "__func__", _unwrapped(hook))
    return getattr(fn, "__module__", None) or type(fn).__module__ or ""


def _name(hook: Any) -> str:
    hook = _unwrapped(hook)
    return getattr(hook, "__qualname__", None) or type(hook).__qualname__


def user_hooks(model: nn.Module) -> List[str]:
    """Where ``model`` has forward hooks (or pre-hooks) of the user's: ``"layer: hook"`` each, the
    model itself named ``model``; module-wide ones (``register_module_forward_hook``) too."""
    places = [(layer or "model", module._forward_hooks, module._forward_pre_hooks)
              for layer, module in model.named_modules()]
    places.append(("every module", torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks))
    return [f"{where}{kind}: {_name(hook)}" for where, after, before in places
            for kind, hooks in (("", after), (" (pre)", before)) for hook in hooks.values()
            if not _origin(hook).startswith(OWN)]


def look(engine: Any) -> List[str]:
    """Set ``engine.hooked`` to the forward hooks of the user's its model has (on several devices;
    none on one), refused where the forwards wait for each other (``refuse_waiting``); at the start,
    and again when a callback registered or removed one. Returns those new since the last look."""
    was = engine.hooked
    engine.hooked = user_hooks(engine.task.model) if len(engine.devices) > 1 else []
    refuse_waiting(engine.hooked, engine.sync_batchnorm,
                   engine.gathering is not None or engine.evaluation_gathering is not None)
    return [h for h in engine.hooked if h not in was]


def followed(engine: Any, log: Callable[[str], None]) -> Callable[[], None]:
    """What a run does once a callback's forward hooks are on every device's copy (``ModelEdits``):
    look again (the forwards in turn from the next step and evaluation), and say so of new ones."""
    def changed() -> None:
        new = look(engine)
        if new:
            log(in_turn_line(new, len(engine.devices), registered=True))
    return changed


def in_turn_line(hooks: List[str], devices: int, registered: bool = False) -> str:
    """The line saying the forwards run in turn for ``hooks`` (``registered``: by a callback, mid-run)."""
    return (f"dptrain: {'a callback registered ' if registered else 'the model has '}forward hooks of yours "
            f"({shown(hooks)}): on {devices} devices of a process their forwards run one after another, so that a "
            f"hook keeping a layer's output gives each device's step its own (the backward passes still run at once)"
            + (" and every device's copy of the model has them" if registered else ""))


def shown(hooks: List[str]) -> str:
    """The first few of ``hooks`` for a line."""
    return ", ".join(hooks[:3]) + (f" and {len(hooks) - 3} more" if len(hooks) > 3 else "")


def refuse_waiting(hooks: List[str], sync_batchnorm: bool, whole_batch: bool) -> None:
    """A ``TurnsError`` for ``hooks`` where the forwards wait for each other (``WAITS``), which
    in turn would wait for ever."""
    setting = "sync_batchnorm" if sync_batchnorm else "whole_batch" if whole_batch else None
    if hooks and setting is not None:
        raise TurnsError(TURNS_ERROR.format(hooks=shown(hooks), setting=setting, waits=WAITS[setting]))
