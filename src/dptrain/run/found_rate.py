"""Lightning's ``LearningRateFinder`` callback given to ``fit``: the range test first, then the
training at the rate it found, as Lightning's ``Trainer`` runs it at the fit's start.

    dptrain.fit(model, train, callbacks=[LearningRateFinder(max_lr=0.1)], loss=..., optimizer=...)

``fit`` runs ``dptrain.lr_find`` (``run/lr_find.py``) on the model and training data with the
callback's settings (``min_lr``, ``max_lr``, ``num_training_steps``, ``mode``,
``early_stop_threshold``) and fit's own keywords (loss, optimizer, batch size, devices...: all
but the schedule's, the epochs, the callbacks and what writes files: ``LEFT_OUT``), the model's
weights put back after it; then
trains with ``lr=`` its suggestion (the rate an ``lr=`` given to fit would have been), and with
the callback's ``update_attr`` (Lightning's default) sets it on the model's ``lr`` or
``learning_rate`` too (which a LightningModule's ``configure_optimizers`` reads). The callback's
``optimal_lr`` is the test (``.suggestion()``, ``.results``), as Lightning's. A test that finds
no rate (too few finite losses) leaves the rate as it was, and says so. A subclass of one's own
(Lightning's ``FineTuneLearningRateFinder`` example, tests at chosen epochs) is not taken: the
error names ``dptrain.lr_find``.
"""
from __future__ import annotations

from typing import Any, Dict, List

from torch import nn

from ..callbacks.hook_names import framework_class


#: fit's keywords the test leaves to the training: its files (written once, by the training), its time and
#: its evaluations (the test evaluates nothing).
LEFT_OUT = ("callbacks", "metrics_file", "tensorboard", "trace", "trace_steps", "trace_from", "checkpoint_every",
            "overwrite", "max_time", "eval_every_n_steps")


def _finder(cb: Any) -> bool:
    """Whether ``cb`` is Lightning's own ``LearningRateFinder`` (not a subclass of one's own)."""
    cls = framework_class(cb)
    return cls is type(cb) and cls.__name__ == "LearningRateFinder" and cls.__module__.split(".")[0] in (
        "lightning", "pytorch_lightning")


def with_found_rate(model: nn.Module, train_data: Any, what: Dict[str, Any], settings: Dict[str, Any]) -> List[str]:
    """If ``what``'s callbacks (fit's keywords: a list) hold Lightning's ``LearningRateFinder``: take it
    out, run the range test and set ``what["lr"]`` to its suggestion (see the module
    docstring); return the line saying so."""
    listed = what["callbacks"]             # (fit's: a list)
    finders = [cb for cb in listed if _finder(cb)]
    if not finders:
        return []
    if len(finders) > 1:
        raise ValueError("callbacks holds 2 LearningRateFinder callbacks: give one (the range test runs once, "
                         "before training)")
    from .lr_find import MADE_HERE, lr_find, set_rate       # (lr_find runs fit: imported when needed)
    cb = finders[0]
    what["callbacks"] = [c for c in listed if c is not cb]
    keywords = {k: v for k, v in {**what, **settings}.items() if k not in MADE_HERE + LEFT_OUT}
    settings_of = {"min_lr": cb._min_lr, "max_lr": cb._max_lr, "num_training": cb._num_training_steps,
                   "mode": cb._mode, "early_stop_threshold": cb._early_stop_threshold}
    finder = lr_find(model, train_data, **settings_of, **keywords)
    cb.optimal_lr = finder
    lr = finder.suggestion()
    shown = ", ".join(f"{k}={v!r}" for k, v in settings_of.items())
    if lr is None:
        return [f"lightning's LearningRateFinder: the range test (dptrain.lr_find, {shown}) found no rate (too "
                f"few finite losses): the rate is as given"]
    before = what.get("lr")
    what["lr"] = lr
    if getattr(cb, "_update_attr", True):
        set_rate(model, lr)
    return [f"lightning's LearningRateFinder ran the range test (dptrain.lr_find, {shown}) before training: "
            f"lr {lr:.3g}" + (f" (in place of the lr={before!r} given)" if before is not None else "")]
