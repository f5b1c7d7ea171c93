"""A keyword ``fit``, ``evaluate`` or ``predict`` does not take: the error names ours.

Keras's, Lightning's and Accelerate's users bring their keywords (``verbose=0``,
``validation_data=``, ``dataloaders=``); Python's "unexpected keyword argument" says nothing
of what to write instead. Each entry point has a table of its peers' names here
(``PEER_KEYWORDS``: fit's; ``EVALUATE_PEERS``; ``PREDICT_PEERS``); a typo names the nearest::

    @keywords_checked(EVALUATE_PEERS)
    def evaluate(model, data, *, loss=None, ...): ...

    evaluate(model, (X, y), verbose=0)
    TypeError: evaluate() got an unexpected keyword argument 'verbose'; dptrain has none: it prints nothing
"""
from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, Dict, Sequence, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Peers' names every entry point answers alike (fit's ``PEER_KEYWORDS`` takes them too).
COMMON_PEERS = {"workers": "num_workers", "use_multiprocessing": "num_workers (worker processes load the data)"}

_SHARED = {**COMMON_PEERS,
           "x": "data (the second argument: {name}(model, (x, y)))", "y": "data ({name}(model, (x, y)))",
           "dataloaders": "data (the second argument: a DataLoader, a Dataset or tensors)",
           "datamodule": "data ({name}(model, dm): a LightningDataModule's loaders are taken)",
           "steps": "none: every sample of the data (a DataLoader's sampler, or data[:N], for fewer)",
           "callbacks": "none: a callback's work goes around the call",
           "ckpt_path": "none: dptrain.load_weights(model, path) first", "accelerator": "devices"}

#: Keras's ``evaluate`` and Lightning's ``trainer.test``/``validate`` keywords.
EVALUATE_PEERS = {**_SHARED, "verbose": "none: evaluate prints nothing", "return_dict": "none: the figures are a dict",
                  "validation_data": "data (the second argument)"}
#: Keras's ``predict`` and Lightning's ``trainer.predict`` keywords.
PREDICT_PEERS = {**_SHARED, "verbose": "none: predict prints nothing",
                 "sample_weight": "none: predict's outputs are not weighed (weights weigh a loss: fit's and "
                                  "evaluate's sample_weight=)",
                 "return_predictions": "none: the outputs are returned"}
#: Keras's, Lightning's and Accelerate's names for what ``fit`` takes (``fit.py``): the error names ours (or,
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


def unexpected_keyword(name: str, key: str, known: Sequence[str], peers: Dict[str, str]) -> TypeError:
    """The error for ``name()`` given ``key``: a peer's name says ours (or, "none: ...", what to
    do instead), a typo the nearest keyword, else the keywords it takes."""
    if key in peers:
        hint = peers[key].format(name=name)
        hint = f"dptrain has none: {hint[6:]}" if hint.startswith("none: ") else f"dptrain's is {hint}"
        return TypeError(f"{name}() got an unexpected keyword argument {key!r}; {hint}")
    near = difflib.get_close_matches(key, list(known), n=1)
    return TypeError(f"{name}() got an unexpected keyword argument {key!r}"
                     + (f"; did you mean {near[0]!r}?" if near else f"; it takes {', '.join(known)}"))


def keywords_checked(peers: Dict[str, str]) -> Callable[[F], F]:
    """Wrap a function of keyword-only settings so that an unknown keyword is
    ``unexpected_keyword``'s error, and Keras's ``fn(model, x, y)`` says the data is one argument."""
    def wrap(fn: F) -> F:
        parameters = inspect.signature(fn).parameters
        known = [p for p, v in parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
        positional = len(parameters) - len(known)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if len(args) > positional:
                raise TypeError(f"{fn.__name__}() takes the data as one argument, {fn.__name__}(model, (X, y)) "
                                f"(Keras's {fn.__name__}(x, y)); every setting is a keyword")
            for key in kwargs:
                if key not in parameters:
                    raise unexpected_keyword(fn.__name__, key, known, peers)
            return fn(*args, **kwargs)
        return checked  # type: ignore[return-value]
    return wrap
