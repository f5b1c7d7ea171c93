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
from dataclasses import MISSING, fields
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, SequentialSampler

from ..callbacks.base import CallbackList
from ..callbacks.lightning_hooks import with_module_hooks
from ..callbacks.peer_callbacks import adopt
from ..distributed.env import rank
from ..data.choose_loader import lists_as_columns
from ..engine import lightning_adopt
from ..engine.lightning_trainer import TrainerStandIn, detach
from ..engine.metric_names import metrics_copied
from ..parallel.given_model import unwrapped
from ..engine.task import DEFAULT_EPOCHS, Task
from ..parallel.optim import DEFAULT_LRS
from ..outputs.plot import draw
from .config import TrainConfig
from .flag_words import keyword_errors, keyword_log
from .float64_data import float64_named
from .found_rate import with_found_rate
from .keywords import COMMON_PEERS, unexpected_keyword
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
#: Keras's, Lightning's and Accelerate's names for what ``fit`` takes: the error names ours (or,
#: "none: ...", what to do instead).
PEER_KEYWORDS = {
    **COMMON_PEERS,
    "validation_data": "eval_data (fit's third argument: fit(model, (X, y), (X_val, y_val)))",
    "val_dataloaders": "eval_data (fit's third argument)", "train_dataloaders": "train_data (fit's second argument)",
    "datamodule": "train_data (fit(model, dm): a LightningDataModule's loaders are taken)",
    "x": "train_data (fit(model, (x, y)))", "y": "train_data (fit(model, (x, y)))",
    "verbose": "log (log=None: quiet; progress=False: no progress bar)", "max_epochs": "epochs",
    "validation_freq": "eval_every", "check_val_every_n_epoch": "eval_every",
    "val_check_interval": "eval_every_n_steps", "gradient_clip_val": "clip_grad_norm (or clip_grad_value)",
    "gradient_accumulation_steps": "accumulate_grad_batches", "mixed_precision": "amp ('bf16' or 'fp16')",
    "precision": "amp ('bf16' or 'fp16')", "default_root_dir": "checkpoint_dir",
    "limit_train_batches": "max_batches", "lr_scheduler": "scheduler", "callback": "callbacks",
    "min_epochs": "callbacks=[EarlyStopping(..., start_from_epoch=N)] (no epoch up to N is watched, so none "
                  "stops the run)",
    "limit_val_batches": "eval_batches (the first N evaluation batches)", "validation_steps": "eval_batches",
    "overfit_batches": "max_batches=N with shuffle=False (the same first N batches every epoch)",
    "fast_dev_run": "epochs=1, max_batches=1, eval_batches=1 (one batch of each)",
    "initial_epoch": "resume=True with checkpoint_dir (a run goes on from its checkpoint's epoch)",
    "num_sanity_val_steps": "none: fit tries the model on a training and an evaluation batch before every run",
    "deterministic": "seed (a run is repeatable by its seed; torch.use_deterministic_algorithms(True) is yours "
                     "to call)",
    "benchmark": "none: set torch.backends.cudnn.benchmark yourself", "detect_anomaly":
        "none: call torch.autograd.set_detect_anomaly(True) before fit (on_nan='stop' ends a run at a NaN loss)",
    "logger": "tensorboard (a folder), metrics_file (JSON lines, or a table: a .csv file), or a callback of your own",
    "enable_checkpointing": "checkpoint_dir (none: no checkpoints)", "enable_progress_bar": "progress",
    "accelerator": "devices ('auto': every GPU, else the CPU; 'cpu'; a count; or a list such as ['cuda:0', "
                   "'cuda:1'])",
    "gpus": "devices (a count, or a list such as ['cuda:0', 'cuda:1'])",
    "strategy": "none: training is data-parallel; several processes run with dptrain launch --processes N "
                "(or torchrun)",
    "num_nodes": "none: dptrain launch --nnodes N (or torchrun) starts the processes of several machines",
    "gradient_clip_algorithm": "clip_grad_norm=X or clip_grad_value=X",
    "profiler": "trace (a Chrome/Perfetto timeline of a few steps)",
    "auto_lr_find": "none: run finder = dptrain.lr_find(model, data, ...) (the range test, with fit's keywords) "
                    "before fit, and give fit lr=finder.suggestion()",
    # Hugging Face's Trainer and TrainingArguments
    "compute_metrics": "metrics=dptrain.whole_set(compute_metrics) (called once on the whole evaluation set's "
                       "(predictions, label_ids); its keys name the test_* figures)",
    "preprocess_logits_for_metrics": "metrics=dptrain.whole_set(compute_metrics, "
                                     "preprocess=preprocess_logits_for_metrics)",
    "args": "none: fit takes each of TrainingArguments' settings as a keyword of its own (num_train_epochs -> "
            "epochs, per_device_train_batch_size -> batch_size, learning_rate -> lr...)",
    "num_train_epochs": "epochs", "learning_rate": "lr", "max_grad_norm": "clip_grad_norm",
    "per_device_train_batch_size": "batch_size (the global batch: the size per device times the devices and processes)",
    "logging_steps": "log_every_n_steps", "eval_steps": "eval_every_n_steps",
    "eval_strategy": "eval_every=N (epochs) or eval_every_n_steps=N (steps)",
    "output_dir": "checkpoint_dir", "data_collator": "collate_fn",
    "train_dataset": "train_data (fit's second argument)",
    "eval_dataset": "eval_data (fit's third argument)", "dataloader_num_workers": "num_workers",
    "resume_from_checkpoint": "resume=True with checkpoint_dir", "fp16": "amp='fp16'", "bf16": "amp='bf16'",
    "weight_decay": "optimizer=functools.partial(torch.optim.AdamW, weight_decay=0.01)",
    "load_best_model_at_end": "callbacks=[dptrain.callbacks.EarlyStopping('eval_loss', patience=N, "
                              "restore_best_weights=True)] (the best epoch's weights restored at the end)",
    "metric_for_best_model": "none: it is the monitor of an EarlyStopping or BestCheckpoint callback "
                             "('eval_loss', 'eval_accuracy': the eval_data's figures)",
    **dict.fromkeys(("warmup_steps", "warmup_ratio", "lr_scheduler_type", "lr_scheduler_kwargs"),
                    "scheduler=lambda optimizer: transformers.get_linear_schedule_with_warmup(optimizer, WARMUP, "
                    "TOTAL) with scheduler_interval='batch' (any torch scheduler, as a function of the optimizer)"),
    "evaluation_strategy": "eval_every=N (epochs) or eval_every_n_steps=N (steps)",
    "save_steps": "checkpoint_every (N batches, with checkpoint_dir)",
    "save_strategy": "checkpoint_dir (a checkpoint every epoch; checkpoint_every=N also every N batches)",
    "save_total_limit": "none: checkpoint_dir keeps the latest checkpoint; BestCheckpoint(path, save_top_k=N) "
                        "keeps the N best epochs' weights",
    "per_device_eval_batch_size": "eval_batch_size (the global batch: the size per device times the devices and "
                                  "processes)",
    "gradient_checkpointing": "none: call model.gradient_checkpointing_enable() (or torch.utils.checkpoint in "
                              "forward) before fit",
    "label_smoothing_factor": "loss=torch.nn.CrossEntropyLoss(label_smoothing=0.1)",
    "report_to": "tensorboard (a folder) or metrics_file", "logging_dir": "tensorboard (a folder)",
    "disable_tqdm": "progress (progress=False)",
    "validation_batch_size": "eval_batch_size",
    "auto_find_batch_size": "none: give batch_size (the global batch, split over the devices and processes)",
    "max_queue_size": "none: num_workers=N reads the data ahead in N processes",
    "eval_accumulation_steps": "none: an evaluation keeps sums, not outputs (dptrain.whole_set(fn) keeps them)",
    **dict.fromkeys(("adam_beta1", "adam_beta2", "adam_epsilon"),
                    "optimizer=functools.partial(torch.optim.AdamW, betas=(0.9, 0.999), eps=1e-8)"),
    "label_names": "none: a dict batch's target is its y, target(s) or label(s) key; a batch with none of them "
                   "trains on the loss its model computes from it (start_positions, end_positions); "
                   "forward=fn(model, batch) -> (output, target) for another",
    "remove_unused_columns": "none: a dict batch's keys are forward's arguments; leave the others out in "
                             "collate_fn",
    "group_by_length": "none: a DataLoader whose batch_sampler groups samples by length (see Samplers)",
    "include_inputs_for_metrics": "none: a metric's function gets (output, target)",
    "prediction_loss_only": "none: without metrics= an evaluation gives the loss (and a classifier's accuracy)",
    "full_determinism": "seed (a run is repeatable by its seed; torch.use_deterministic_algorithms(True) is yours "
                        "to call)",
    "data_seed": "seed", "dataloader_drop_last": "drop_last", "optim": "optimizer (a name such as 'adamw', or a "
                                                                        "torch.optim class)",
    "torch_compile": "compile (compile=True)", "dataloader_pin_memory": "none: batches are moved to the GPUs "
                                                                        "by dptrain",
    # torch's DataLoader: its own settings come with it, as the data
    "sampler": "none: train_data=torch.utils.data.DataLoader(data, batch_size=N, sampler=sampler) (its sampler "
               "picks the samples, drawn alike in every process; see the README's Samplers)",
    "batch_sampler": "none: train_data=torch.utils.data.DataLoader(data, batch_sampler=batch_sampler) (each of its "
                     "batches is a global batch, cut between the devices and processes)",
    **{key: f"none: train_data=torch.utils.data.DataLoader(data, batch_size=N, num_workers=N, {key}=...) (its "
            "workers' settings are used)" for key in ("worker_init_fn", "prefetch_factor", "multiprocessing_context")},
    "pin_memory": "none: batches are moved to the GPUs by dptrain (pinned when a GPU trains)",
    "persistent_workers": "none: num_workers=N keeps its workers from epoch to epoch"}


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
        what["callbacks"], said = adopt(what.get("callbacks") or ())    # (Keras's, Lightning's EarlyStopping)
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
    if isinstance(train_data, DataLoader) and isinstance(train_data.sampler, SequentialSampler) \
            and "shuffle" not in settings:
        notes.append("the DataLoader does not shuffle, but fit shuffles the training samples every epoch (by "
                     "seed and epoch); pass shuffle=False to keep their order")
    if log is not None and rank() == 0:
        for line in notes:
            log(f"dptrain: {line}")
    what["metrics"] = metrics_copied(what.get("metrics"))
    what["callbacks"] = what.get("callbacks") or ()
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
