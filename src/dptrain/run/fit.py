"""``dptrain.fit``: train any model on any data, on every device, with every feature of the loop.

Runbook (the same script everywhere):
    python train.py                                   # all GPUs, else 2 virtual CPU devices
    dptrain launch --processes 2 train.py             # 2 processes on this machine
    torchrun --nproc-per-node 2 train.py              # the same, started by torchrun
    torchrun --nnodes 2 --node-rank 0 --master-addr HOST --nproc-per-node 1 train.py   # 2 machines

    import dptrain, torch
    from torch import nn
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    X, y = torch.randn(1000, 8), torch.randn(1000, 1)
    result = dptrain.fit(model, (X, y), loss=nn.MSELoss(), optimizer=torch.optim.AdamW, lr=1e-3,
                         epochs=5, batch_size=64)
    result["history"]          # one row per epoch; model is trained in place
"""
from __future__ import annotations

import inspect
from dataclasses import MISSING, fields, replace
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..callbacks.base import CallbackList
from ..callbacks.lightning_hooks import with_module_hooks
from ..callbacks.peer_callbacks import adopt
from ..distributed.env import rank
from ..data.choose_loader import lists_as_columns
from ..data.samplers import shuffles
from ..engine import lightning_adopt
from ..engine.lightning_trainer import TrainerStandIn, detach
from ..engine.metric_names import metrics_copied
from ..parallel.given_model import unwrapped
from ..engine.task import DEFAULT_EPOCHS, Task, callback_list
from ..parallel.optim import DEFAULT_LRS
from ..outputs.plot import draw
from .config import TrainConfig
from .flag_words import keyword_errors, keyword_log
from .float64_data import float64_named
from .found_rate import with_found_rate
from .keywords import PEER_KEYWORDS, unexpected_keyword
from .lightning_data import data_of
from .session import Log, run_task

#: ``Task`` fields ``fit`` takes as keywords (the model and the data are its arguments).
TASK_KEYWORDS = ("loss", "reduction", "forward", "step", "optimizer", "optimizer_params", "lr", "scheduler",
                 "scheduler_interval", "scheduler_monitor", "metrics", "init", "collate_fn", "epochs", "batch_size",
                 "kvstore", "callbacks", "name", "class_weight", "sample_weight")
#: ``TrainConfig`` settings ``fit`` takes as keywords (each declared once, in ``config.py``).
CONFIG_KEYWORDS = tuple(f.name for f in fields(TrainConfig) if f.metadata.get("fit", True))
#: Keywords ``fit`` took before each setting had one name everywhere.
RENAMED = {"bucket_mb": "bucket_cap_mb"}


@keyword_errors
def fit(model: nn.Module, train_data: Any = None, eval_data: Any = None, *, plot: Optional[str] = None,
        log: Optional[Log] = print, **settings: Any) -> Dict[str, Any]:
    """Train ``model`` on ``train_data`` data-parallel; return the result with its ``history``.

    What (see ``dptrain.Task``): ``model`` (trained in place), ``train_data``/``eval_data``
    (a ``Dataset``, tensors ``(X, y)``, a dict of tensors, a ``DataLoader``; a
    ``LightningDataModule``, or none for a ``LightningModule``'s own loaders:
    ``lightning_data.py``), ``loss`` (any reduction; default
    cross-entropy), ``forward(model, batch) -> (output, target)`` or ``step(model, batch) ->
    loss``, ``optimizer`` (name, ``torch.optim`` class or factory, or an optimizer built on
    ``model``), ``lr``, ``scheduler(optimizer)`` stepped per ``scheduler_interval``,
    ``metrics={name: fn(output, target) -> (sum, count) or a torchmetrics object}``,
    ``init(model)``, ``collate_fn``; several optimizers (a GAN): ``step`` and ``optimizer``
    dicts with the same names, each batch running each step and its update in turn
    (``engine/updates.py``),
    ``epochs``, ``batch_size`` (global: split over every device of every process),
    ``kvstore``, ``callbacks`` (``dptrain.Callback``: hooks at each batch and epoch, which
    can stop the run and keep state in checkpoints), ``name``.

    How: every setting of ``TrainConfig`` that ``fit`` takes (listed below, with the same
    names, defaults and checks as the ``dptrain train`` flags), ``plot`` (a file drawn
    after the run), ``log`` (None: quiet).

    With ``WORLD_SIZE`` > 1 in the environment (``torchrun``, ``dptrain launch``) each process
    joins the process group, trains its part of every global batch, and rank 0 alone logs and
    writes files; every process returns the same result and ends with the same weights.

    >>> result = dptrain.fit(net, train_set, test_set, epochs=2)
    epoch 1, 3.1 sec, train loss 0.712, test loss 0.55, test acc 0.801
    >>> result["test_acc"], result["devices"]
    (0.834, ['cpu:0', 'cpu:1'])
    """
    if _is_array(train_data) and _is_array(eval_data) and "step" not in settings and "forward" not in settings:
        raise TypeError("fit(model, X, y) takes y as the evaluation data: the training data is one argument, "
                        "fit(model, (X, y), ...) (Keras's fit(x, y)); evaluation data comes third, "
                        "fit(model, (X, y), (X_val, y_val))")
    for old, new in RENAMED.items():
        if old in settings:
            if new in settings:
                raise TypeError(f"fit() got both {old!r} and {new!r} (its new name): give {new!r}")
            settings[new] = settings.pop(old)
    known = TASK_KEYWORDS + CONFIG_KEYWORDS
    for key in settings:
        if key in PEER_KEYWORDS or key not in known:
            raise unexpected_keyword("fit", key, known, PEER_KEYWORDS)
    what = {k: settings.pop(k) for k in TASK_KEYWORDS if k in settings}
    what["callbacks"] = callback_list(what.get("callbacks"))     # (a list, or one: a list from here on)
    found = with_found_rate(model, train_data, what, settings)     # (Lightning's LearningRateFinder: the test first)
    log = keyword_log(log)      # (its lines name the keywords, as its errors do: flag_words.py)
    config = TrainConfig(**settings)
    train_data, eval_data = lists_as_columns(train_data), lists_as_columns(eval_data)     # ((X, labels_list))
    lightning = data_of(model, train_data, eval_data, what)     # (a data module, the module's own data)
    # A LightningModule's trainer for the run: a stand-in (engine/lightning_trainer.py).
    stand_in = TrainerStandIn(what.get("epochs") or (DEFAULT_EPOCHS if config.max_steps is None else -1),
                              config.max_steps, config.accumulate_grad_batches,
                              lightning.data_module if lightning is not None else None, config.checkpoint_dir,
                              (config.clip_grad_norm, config.clip_grad_value))
    try:
        notes: List[str] = list(found)
        if lightning is not None:
            train_data, eval_data, notes = lightning.take(config)
        notes += lightning_adopt.adopt(model, what, stand_in)
        what["callbacks"], said = adopt(what["callbacks"])    # (Keras's, Lightning's EarlyStopping)
        notes += said
        notes += with_module_hooks(model, what)     # (and Lightning callbacks of one's own)
        CallbackList(what["callbacks"])             # (their hooks checked now, before any set-up: a TypeError)
        with float64_named(model, train_data, eval_data):
            return _fit(model, train_data, eval_data, what, config, settings, notes, plot, log)
    finally:
        detach(unwrapped(model))
        if lightning is not None:
            lightning.teardown()


def _fit(model: nn.Module, train_data: Any, eval_data: Any, what: Dict[str, Any], config: TrainConfig,
         settings: Dict[str, Any], notes: List[str], plot: Optional[str], log: Optional[Log]) -> Dict[str, Any]:
    """``fit`` of its data taken and its LightningModule adopted: say the defaults, train."""
    notes = notes + defaults_said(what, train_data)
    if isinstance(train_data, DataLoader) and "shuffle" not in settings and shuffles(train_data) is False:
        config = replace(config, shuffle=False)     # a shuffle=False DataLoader's order, as Lightning and Accelerate keep it
    if log is not None and rank() == 0:
        for line in notes:
            log(f"dptrain: {line}")
    what["metrics"] = metrics_copied(what.get("metrics"))
    torch.manual_seed(settings.get("seed", 0))
    task = Task(model, train_data, eval_data, **what)
    # Called under torch.inference_mode() (a notebook cell's, a server's): the tensors training
    # makes must track versions and gradients, as they do under torch.no_grad() (thread-local).
    with torch.inference_mode(False):
        result = run_task(task, config, log, plot, keep_group=True)
    if plot and rank() == 0:
        try:
            draw(result, plot)
        except ValueError as e:         # the training is done: say so, and return it all the same
            (log or print)(f"dptrain: could not draw the plot: {e}")
    return result


def defaults_said(what: Dict[str, Any], train_data: Any) -> List[str]:
    """Take the batch size of a ``DataLoader`` (as the global batch) unless ``batch_size`` is
    given; return one line for each default a user may not expect."""
    notes = []
    if "optimizer" not in what:
        lr = what.get("lr", DEFAULT_LRS["sgd"])
        notes.append(f"no optimizer given: SGD at lr {lr:g} (choose one: optimizer=torch.optim.AdamW, lr=1e-3)")
    loader_batch = getattr(train_data, "batch_size", None) if isinstance(train_data, DataLoader) else None
    if isinstance(train_data, DataLoader) and loader_batch is None and "batch_size" in what:
        maker = f"{type(train_data.batch_sampler).__name__}" if train_data.batch_sampler is not None else \
            f"dataset {type(train_data.dataset).__name__}"
        notes.append(f"batch_size={what['batch_size']} is not used: the DataLoader's {maker} makes the batches")
    if loader_batch:
        if "batch_size" not in what:
            what["batch_size"] = loader_batch
        elif what["batch_size"] != loader_batch:
            notes.append(f"batch_size={what['batch_size']} is used, not the DataLoader's {loader_batch}")
    return notes


def _signature() -> inspect.Signature:
    """``fit``'s signature with every keyword it takes, for ``help(dptrain.fit)`` and editors."""
    def default(f):
        return f.default if f.default is not MISSING else f.default_factory()     # type: ignore[misc]
    task = {f.name: f for f in fields(Task)}
    config = {f.name: f for f in fields(TrainConfig)}
    params = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("train_data", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
              inspect.Parameter("eval_data", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=default(task[k])) for k in TASK_KEYWORDS]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=default(config[k]))
               for k in CONFIG_KEYWORDS]
    params += [inspect.Parameter("plot", inspect.Parameter.KEYWORD_ONLY, default=None),
               inspect.Parameter("log", inspect.Parameter.KEYWORD_ONLY, default=print)]
    return inspect.Signature(params)


fit.__signature__ = _signature()        # type: ignore[attr-defined]
fit.__doc__ += "\n    Settings:\n" + "\n".join(       # type: ignore[operator]
    f"      {f.name} = {f.default!r}: {f.metadata['help']}" for f in fields(TrainConfig) if f.name in CONFIG_KEYWORDS)


def _is_array(data: Any) -> bool:
    """A tensor or a NumPy array (not a pair, a dict, a Dataset)."""
    return isinstance(data, torch.Tensor) or type(data).__module__ == "numpy"
