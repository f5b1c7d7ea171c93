"""A ``LightningModule``'s own ``on_save_checkpoint`` and ``on_load_checkpoint``: what the module
keeps in the run's checkpoint besides its weights.

    class MoCo(L.LightningModule):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["queue"] = self.queue        # (not a parameter or buffer: kept by hand)

        def on_load_checkpoint(self, checkpoint):
            self.queue = checkpoint["queue"]

Each time ``fit`` writes the run's checkpoint (``checkpoint_dir=``), the module's
``on_save_checkpoint`` is called, once (on rank 0), on the module, with a dict for the module's
own entries, which the checkpoint keeps with the callbacks' states; when the run resumes, its
``on_load_checkpoint`` is given that dict back, on every process, once the weights, optimizer and
schedule are back (Lightning calls it just before them). Lightning's own entries
(``state_dict``, ``optimizer_states``, ``epoch``...) are not in the dict: fit saves and restores
those itself, and a hook reading one gets a ``KeyError`` saying so. A Lightning callback's
``on_save_checkpoint(trainer, pl_module, checkpoint)`` and ``on_load_checkpoint`` get the same
dict, and its ``state_dict()`` is kept and given back to its ``load_state_dict``.
"""
from __future__ import annotations

from typing import Any, Dict

from torch import nn

from ..engine.lightning_module import overridden
from .base import Callback

#: The module's hooks of the run's checkpoint.
CHECKPOINT_HOOKS = ("on_save_checkpoint", "on_load_checkpoint")


class Entries(dict):
    """The dict the hooks are given: only the module's own entries (see the module docstring)."""

    def __missing__(self, key: Any) -> Any:
        raise KeyError(f"{key!r}: fit gives the module's on_save_checkpoint and on_load_checkpoint a dict of the "
                       f"module's own entries only (fit saves and restores the weights, optimizer, schedule and "
                       f"epoch itself): keep in it what else the module needs back, and read that")


class ModuleCheckpointHooks(Callback):
    """Calls the module's ``on_save_checkpoint`` as the checkpoint is written and its
    ``on_load_checkpoint`` as the run resumes (those of ``CHECKPOINT_HOOKS`` it overrides), and
    its Lightning callbacks' (``targets``: ``lightning_callbacks.HookTargets``): theirs with the
    trainer and the module first, and their own ``state_dict``, kept beside the entries."""

    state_key = "LightningModule"       # (its name among the callbacks' states)

    def __init__(self, module: nn.Module, targets: Any = None):
        self.module, self.targets = module, targets
        self.hooks = set(overridden(module, CHECKPOINT_HOOKS))

    def state_dict(self) -> Dict[str, Any]:
        checkpoint = Entries()
        if self.targets is not None:        # (Lightning's order: the callbacks', then the module's)
            self.targets.of_callbacks("on_save_checkpoint", checkpoint)
        if "on_save_checkpoint" in self.hooks:
            self.module.on_save_checkpoint(checkpoint)
        return {"entries": dict(checkpoint), **({"callbacks": self.targets.states()} if self.targets else {})}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        checkpoint = Entries(state.get("entries") or {})
        if "on_load_checkpoint" in self.hooks:      # (Lightning's order: the module's, then the callbacks')
            self.module.on_load_checkpoint(checkpoint)
        if self.targets is not None:
            self.targets.of_callbacks("on_load_checkpoint", checkpoint)
            self.targets.load_states(state.get("callbacks") or {})
