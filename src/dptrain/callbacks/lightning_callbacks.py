"""Lightning ``Callback``s of one's own, given to ``fit`` with a ``LightningModule``: each hook
called with the module's trainer and the module, where Lightning's ``Trainer`` calls it.

    class PrintVal(L.Callback):
        def on_validation_epoch_end(self, trainer, pl_module):
            print(trainer.current_epoch, trainer.callback_metrics["val_loss"])

    dptrain.fit(lit_model, train, val, callbacks=[PrintVal()])     # trainer.fit(..., callbacks=[...])

Their hooks take that framework's trainer: here it is the module's stand-in
(``engine/lightning_trainer.py``: ``current_epoch``, ``global_step``, ``callback_metrics``,
``should_stop``, ``lightning_module``, ``optimizers``, ``logger``...), so a callback of one's own
runs as it is beside a module taken as a LightningModule (for any other model it is an error
naming ``dptrain.Callback``). Called, in Lightning's order (each callback's, in the order given,
before the module's own): ``setup(stage="fit")`` (after the module's own here, which is called as
its data is taken; before ``configure_optimizers``) and ``teardown``, the hooks of the run's course
(``on_fit_start``... ``on_train_epoch_end``, ``on_fit_end``: ``lightning_hooks.py``), of each
batch (``on_train_batch_start``, ``on_train_batch_end``, ``on_before_zero_grad``,
``on_after_backward``, ``on_before_optimizer_step``: ``lightning_batch_hooks.py``, with what it
says of them), of each evaluation batch (``on_validation_batch_start``, ``on_validation_batch_end``
with the outputs of the devices' parts joined: ``engine/lightning_eval_batch.py``), of the checkpoint (``on_save_checkpoint``, ``on_load_checkpoint``, and the
callback's own ``state_dict``: ``lightning_checkpoint_hooks.py``) and ``on_exception``. What a
hook logs with ``pl_module.log`` goes where the module's own would. Once a process, on the
module, as Lightning's DDP calls them (``trainer.is_global_zero`` on rank 0). The other hooks it
overrides (``on_test_*``, ``on_predict_*``...) are named in a line: not called. Hooks set on the
instance count as its own (Lightning's ``LambdaCallback(on_train_epoch_end=fn)``). Lightning's
``BaseFinetuning`` (``BackboneFinetuning``, and one's own with its ``freeze_before_training`` and
``finetune_function``) runs with Lightning's own hooks (``RUN_AS_THEIRS``): they work on the module's
parameters and the trainer's ``optimizers``, which the stand-in lends (the run's, which takes
``add_param_group`` between steps), and their ``setup`` comes before the run calls
``configure_optimizers`` and copies the model to its devices, as there (``lightning_hooks.py``).
Lightning's other stock callbacks that ``peer_callbacks.py`` neither takes nor names, and
subclasses of them (``ModelPruning``, a ``WeightAveraging`` other than the ``EMAWeightAveraging``
taken as ``LightningEMA``...), are a ``TypeError`` naming what does their work (``STOCK``): their
hooks are Lightning's code for its Trainer's loops, and run here they did nothing (until session 62
they ran so, silently; ``BaseFinetuning`` was refused so until session 64).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from torch import nn

from ..engine.lightning_eval_batch import AROUND
from ..engine.lightning_module import overridden
from .hook_names import framework_class

#: Around each evaluation batch (``engine/lightning_eval_batch.py``: once a process, the parts' outputs joined).
EVAL_BATCH_HOOKS = AROUND["validation_step"]
#: A Lightning callback's hooks that fit calls (beside the module's own of the same names).
CALLED = ("setup", "teardown", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_validation_start",
          "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end",
          "on_train_end", "on_fit_end", "on_train_batch_start", "on_train_batch_end", "on_before_zero_grad",
          "on_after_backward", "on_before_optimizer_step", "on_save_checkpoint", "on_load_checkpoint", "state_dict",
          "load_state_dict", "on_exception", *EVAL_BATCH_HOOKS)
#: ... and those it does not.
NOT_CALLED = ("on_sanity_check_start", "on_sanity_check_end", "on_test_start", "on_test_end", "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start",
              "on_test_batch_end", "on_predict_start", "on_predict_end", "on_predict_epoch_start",
              "on_predict_epoch_end", "on_predict_batch_start", "on_predict_batch_end", "on_before_backward")


#: What does the work of Lightning's stock callbacks that fit neither takes nor can run (their hooks are
#: Lightning's code for its Trainer's loops), by class name (the first of a callback's ancestry).
_AVERAGE = ("give fit callbacks=[ema := dptrain.callbacks.EMA(0.999, evaluate=True)], then ema.copy_to(model) after "
            "fit (each epoch's evaluation on the average; Lightning's copies it in at the end); Lightning's own "
            "EMAWeightAveraging with its buffers averaged, no average function or device of its own, is taken as "
            "dptrain.callbacks.LightningEMA")
STOCK: Dict[str, str] = {
    "EMAWeightAveraging": _AVERAGE,
    "WeightAveraging": _AVERAGE,
    "ModelPruning": "prune the model before fit (torch.nn.utils.prune), or between two fit calls: the devices' "
                    "copies are made when fit starts",
    "SpikeDetection": "give fit on_nan='stop' (a loss that is not finite ends the run; a finite spike is a "
                      "dptrain.Callback's on_batch_end reading batch.loss)",
    "OnExceptionCheckpoint": "give fit checkpoint_dir=DIR (fit saves the run's state every epoch and on Ctrl-C; "
                             "resume=True goes on from it)",
    "BatchSizeFinder": "give fit batch_size=N (the global batch; fit does not search one)",
    "BasePredictionWriter": "call dptrain.predict(model, data) after fit (it returns the outputs, every device's "
                            "and process's, in order: write them from rank 0)",
}


#: Lightning's stock callbacks whose own hooks run here (by the name of a class of their ancestry): a
#: ``BaseFinetuning`` freezes the module's layers in ``setup`` and unfreezes them at an epoch's start into
#: a group of ``trainer.optimizers``, which fit trains as Lightning's Trainer does (tested against
#: Lightning 2.6.6 by hand: ``benchmarks/lightning_by_hand.py``).
RUN_AS_THEIRS = frozenset({"BaseFinetuning"})


def _lightnings(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning")


def runs_as_theirs(cb: Any) -> bool:
    """Whether ``cb`` is a Lightning callback of ``RUN_AS_THEIRS`` (or a subclass of one)."""
    return any(k.__name__ in RUN_AS_THEIRS and _lightnings(k) for k in type(cb).__mro__)


def hooks_of(cb: Any) -> Set[str]:
    """The hooks of ``CALLED`` that ``cb`` defines: those of its own classes (for one of
    ``RUN_AS_THEIRS``, Lightning's classes' too, but the base ``Callback``'s no-ops) and those set
    on it (Lightning's ``LambdaCallback(on_train_epoch_end=fn)``)."""
    if runs_as_theirs(cb):
        defined = {h for h in CALLED for k in type(cb).__mro__
                   if h in vars(k) and not (_lightnings(k) and k.__name__ == "Callback")}
    else:
        defined = set(overridden(cb, CALLED))
    return defined | {h for h in CALLED if callable(vars(cb).get(h))}


def stock_class(cb: Any) -> Optional[type]:
    """The Lightning class of ``cb``'s ancestry (not the base ``Callback``) that defines hooks of its
    own (``EMAWeightAveraging``'s ``WeightAveraging``, ``ModelPruning``...), if any: its hooks are
    Lightning's code for its Trainer, which fit does not run (None for those of ``RUN_AS_THEIRS``)."""
    if runs_as_theirs(cb):
        return None
    for k in type(cb).__mro__:
        if not _lightnings(k) or k.__name__ == "Callback":
            continue
        if any(name in vars(k) for name in CALLED + NOT_CALLED):
            return k
    return None


def _refuse_stock(cb: Any) -> None:
    stock = stock_class(cb)
    if stock is None:
        return
    known = next((STOCK[k.__name__] for k in type(cb).__mro__ if k.__name__ in STOCK), None)
    hooks = [name for name in CALLED + NOT_CALLED if name in vars(stock)]
    what = "" if stock is type(cb) else "a subclass of "
    raise TypeError(f"callback {type(cb).__name__} is {what}Lightning's {stock.__name__}, whose hooks "
                    f"({', '.join(hooks[:4])}{'...' if len(hooks) > 4 else ''}) are Lightning's code for its Trainer's "
                    f"loops, which fit does not run (they would do nothing here): "
                    + (known if known is not None else "write its work as a Lightning Callback of your own (its hooks "
                       "on Lightning's base Callback) or a dptrain.Callback"))


def is_lightning_callback(cb: Any) -> bool:
    """Whether ``cb`` is a Lightning ``Callback`` (of one's own: Lightning's stock ones are taken
    or refused by ``peer_callbacks.py`` first)."""
    cls = framework_class(cb)
    return cls is not None and _lightnings(cls)


class HookTargets:
    """What each of the module's hooks calls: every Lightning callback's hook of that name
    (with the trainer and the module first), then the module's own."""

    def __init__(self, module: nn.Module, callbacks: Sequence[Any], trainer: Any):
        self.module, self.callbacks, self.trainer = module, list(callbacks), trainer
        self.own = [hooks_of(cb) for cb in self.callbacks]
        self._module_own: Dict[str, bool] = {}      # (whether the module overrides a hook: asked each batch)

    def overriding(self, hooks: Sequence[str]) -> List[str]:
        """Those of ``hooks`` the module or a callback overrides."""
        mine = set(overridden(self.module, hooks))
        return [h for h in hooks if h in mine or any(h in own for own in self.own)]

    def of_callbacks(self, hook: str, *args: Any) -> None:
        """Each callback's ``hook(trainer, module, *args)``, in the order given."""
        for k, cb in enumerate(self.callbacks):
            if hook in self.own[k]:
                getattr(cb, hook)(self.trainer, self.module, *args)

    def call(self, hook: str, *args: Any) -> Any:
        """The callbacks' ``hook`` (``of_callbacks``), then the module's ``hook(*args)`` (if its
        own); returns the module's result (None without one)."""
        self.of_callbacks(hook, *args)
        own = self._module_own.get(hook)
        if own is None:
            own = self._module_own[hook] = bool(overridden(self.module, [hook]))
        return getattr(self.module, hook)(*args) if own else None

    def states(self) -> Dict[str, Any]:
        """The callbacks' own ``state_dict()``s, by their place and class."""
        return {f"{k}:{type(cb).__qualname__}": cb.state_dict() for k, cb in enumerate(self.callbacks)
                if "state_dict" in self.own[k]}

    def load_states(self, states: Dict[str, Any]) -> None:
        for k, cb in enumerate(self.callbacks):
            key = f"{k}:{type(cb).__qualname__}"
            if key in states and "load_state_dict" in self.own[k]:
                cb.load_state_dict(states[key])


def lightning_callbacks(what: Dict[str, Any]) -> Tuple[List[Any], List[str]]:
    """Take the Lightning callbacks of one's own out of ``what``'s callbacks (fit's keywords);
    return them and the line saying how they run."""
    listed = list(what.get("callbacks") or [])     # (fit's: a list)
    theirs = [cb for cb in listed if is_lightning_callback(cb)]
    if not theirs:
        return [], []
    for cb in theirs:
        _refuse_stock(cb)
    what["callbacks"] = [cb for cb in listed if not is_lightning_callback(cb)]
    notes = []
    for cb in theirs:
        skipped = overridden(cb, NOT_CALLED) + [h for h in NOT_CALLED if callable(vars(cb).get(h))]
        joins = bool(overridden(cb, ["on_validation_batch_end"])) or callable(vars(cb).get("on_validation_batch_end"))
        notes.append(f"callback {type(cb).__name__} (a Lightning Callback) runs with the module's trainer, its hooks "
                     f"called where Lightning's Trainer calls them" +
                     ("; its on_validation_batch_end gets this process's batch and its devices' outputs joined "
                      "(per-sample rows concatenated, a float number taken as a mean, an integer as a count)"
                      if joins else "") +
                     (f"; its {', '.join(skipped)} not called: give that work to a dptrain.Callback" if skipped else ""))
    return theirs, notes
