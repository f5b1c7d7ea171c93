"""A callback's hooks checked before the run: a method named as Keras or Lightning name their
hooks (``on_train_batch_end``), or a typo of one of ours, would never be called, and a hook
written with a peer's arguments (Keras's ``on_epoch_end(self, epoch, logs)``) would fail
mid-run; both are an error at the start naming the hook to write and its arguments.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Dict, Optional

from ..core.signatures import takes

# each hook's arguments after self, as the run passes them
HOOK_ARGS: Dict[str, str] = {
    "on_fit_start": "run", "on_epoch_start": "run, epoch", "on_batch_start": "run, epoch, batch",
    "on_gradients": "run, batch, grads", "on_batch_end": "run, batch", "on_train_log": "run, row", "on_evaluate_start": "run, epoch",
    "on_evaluate_end": "run, epoch, metrics", "on_epoch_end": "run, epoch, row", "on_checkpoint": "run, path",
    "on_fit_end": "run, result", "on_exception": "run, error"}

# Keras's and Lightning's names for the same moments
PEER_NAMES: Dict[str, str] = {
    "on_train_begin": "on_fit_start", "on_train_start": "on_fit_start", "on_train_end": "on_fit_end",
    "on_epoch_begin": "on_epoch_start", "on_train_epoch_start": "on_epoch_start",
    "on_train_epoch_end": "on_epoch_end", "on_batch_begin": "on_batch_start",
    "on_train_batch_begin": "on_batch_start", "on_train_batch_start": "on_batch_start",
    "on_train_batch_end": "on_batch_end", "on_test_begin": "on_evaluate_start",
    "on_test_start": "on_evaluate_start", "on_validation_start": "on_evaluate_start",
    "on_validation_epoch_start": "on_evaluate_start", "on_test_end": "on_evaluate_end",
    "on_test_epoch_end": "on_evaluate_end", "on_validation_end": "on_evaluate_end",
    "on_validation_epoch_end": "on_evaluate_end", "on_save_checkpoint": "state_dict",
    "on_load_checkpoint": "load_state_dict"}

# the frameworks whose callback classes cannot run here (their hooks take their trainer;
# peer_callbacks.py takes their EarlyStopping as ours and names what does the others' work)
FRAMEWORKS = ("lightning", "pytorch_lightning", "keras", "tensorflow", "transformers", "accelerate")

# Lightning's hooks around backward and the optimizer step: none inside the step here
# (``on_gradients`` is told each update's gradient after it)
STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")


def framework_class(cb: Any) -> Optional[type]:
    """The class of a peer framework in ``cb``'s ancestry (its own, or what it extends)."""
    return next((k for k in type(cb).__mro__ if k.__module__.split(".")[0] in FRAMEWORKS), None)


def check_hooks(cb: Any, overrides: Callable[[Any, str], bool]) -> None:
    """A ``TypeError`` if ``cb`` has a method that the run would never call by the name it has,
    or a hook it ``overrides`` (not the base class's no-op) that cannot take the run's arguments."""
    owner = type(cb).__name__
    foreign = framework_class(cb)
    if foreign is not None:
        raise TypeError(f"callback {owner} is a {foreign.__module__}.{foreign.__qualname__}, whose hooks take that "
                        f"framework's trainer: write it as a dptrain.Callback (its hooks: "
                        f"{', '.join(f'{h}(self, {a})' for h, a in list(HOOK_ARGS.items())[:4])}, ...)")
    for name in dir(cb):
        if not name.startswith("on_") or name in HOOK_ARGS or not callable(getattr(cb, name, None)):
            continue
        ours = _ours(name)
        if ours is not None:
            raise TypeError(f"callback {owner} has a method {name}(), which dptrain never calls: "
                            f"{_write(ours)}")
    for name, args in HOOK_ARGS.items():
        hook = getattr(cb, name, None)
        if callable(hook) and overrides(cb, name) and not takes(hook, args.count(",") + 1):
            raise TypeError(f"callback {owner}'s {name}{_shown(hook)} cannot take the arguments dptrain "
                            f"passes it: write def {name}(self, {args}) (see dptrain.Callback)")


def _ours(name: str) -> Optional[str]:
    if name in PEER_NAMES or name in STEP_HOOKS:
        return PEER_NAMES.get(name, name)
    close = difflib.get_close_matches(name, list(HOOK_ARGS), n=1, cutoff=0.85)
    return close[0] if close else None


def _write(ours: str) -> str:
    if ours in STEP_HOOKS:
        return ("dptrain has no hook inside the step; read each update's gradients in def on_gradients(self, "
                "run, batch, grads) ({name: the gradient summed over every device and process, before clipping}, "
                "told after the update), change them with a hook on a parameter (p.register_hook in on_fit_start), "
                "clip_grad_norm= or a step function of your own (fit(..., step=...)), and see each batch in "
                "on_batch_end(self, run, batch)")
    if ours in HOOK_ARGS:
        return f"write it as def {ours}(self, {HOOK_ARGS[ours]}) (see dptrain.Callback)"
    return ("what a checkpoint should keep of a callback is what its def state_dict(self) returns; "
            "def load_state_dict(self, state) takes it back on a resume (see dptrain.Callback)")


def _shown(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "()"
