"""The typed configuration of a training run: one dataclass behind the CLI, validated once.

A ``TrainConfig`` says *how* to train (devices, epochs, checkpoints...); *what* to train is a
``Task`` (``task.py``), given by a recipe: a built-in name, ``pkg.module:factory`` or
``file.py:factory`` (a function ``(config) -> Task``), or ``--model``/``--data`` factories.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

import torch

from ..data.holdout import check_fraction
from ..data.sources import SOURCES
from ..distributed.env import BACKENDS, DEFAULT_TIMEOUT_S
from ..engine.balance import parse_balance
from ..engine.compiled import check_mode
from ..engine.metric_names import ACCURACY, ERRORS
from ..engine.task import DEFAULT_EPOCHS, Task
from ..engine.updates import NOT_WITH_SEVERAL, check_settings
from ..parallel.combined import CombinedOptimizer
from ..parallel.optim import OPTIMIZERS
from ..parallel.sync import KVSTORES
from ..parallel.sync.buckets import DEFAULT_BUCKET_MB
from ..scratch.allreduce import ALGORITHMS
from .options import Choice, Duration, Positive, Switch, Whole, option, validate

AMP_DTYPES = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


def is_import_spec(text: Optional[str]) -> bool:
    """``pkg.module:name`` or ``path/file.py:name`` (what ``imports.load_object`` reads)."""
    return isinstance(text, str) and ":" in text


def _kvstore(value: str) -> str:
    if value.lower() not in ("none",) + tuple(k for k in KVSTORES if k):
        raise ValueError(f"unknown kvstore {value!r}; choose one of device, local, naive, ring, none")
    return value


def _optimizer(value: str) -> str:
    if not is_import_spec(value) and value.lower() not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {value!r}; choose one of {', '.join(OPTIMIZERS)}, or "
                         f"a class such as torch.optim:AdamW")
    return value


@dataclass
class TrainConfig:
    """Everything a run needs besides its Task, each setting declared once (``options.py``):
    the ``dptrain train`` flags and ``fit``'s keywords are made from these. ``None`` means
    "the task's default"."""
    # What to train (the CLI's: fit takes a model and data).
    recipe: str = option("lenet-scratch", "what to train: a built-in recipe, or yours, pkg.module:function or "
                         "file.py:function returning a dptrain.Task", fit=False, metavar="NAME")
    model: Optional[str] = option(None, "your model: a function returning an nn.Module (with --data)", fit=False,
                                  metavar="PKG.MODULE:FACTORY")
    data: Optional[str] = option(None, "your data: a function returning the training data, or (train, eval): "
                                 "Datasets or tensors (X, y)", fit=False, metavar="PKG.MODULE:FACTORY")
    loss: Optional[str] = option(None, "with --model: cross-entropy (default), mse, l1, huber, bce, nll, or "
                                 "pkg.module:name", fit=False, metavar="NAME")
    metric: Optional[str] = option(None, "with --model: Keras's metrics by name, comma-separated (accuracy, mae, "
                                   "mse), each a test_<name> figure", fit=False, metavar="NAMES")
    dataset: Optional[str] = option(None, "train on this dataset instead of the recipe's", Choice(list(SOURCES)),
                                    fit=False)
    data_dir: Optional[str] = option(None, "folder holding the dataset files (also: $DPTRAIN_DATA)", fit=False)
    # Where.
    devices: Any = option("auto", "auto (all GPUs, else 2 virtual CPU devices), a count N, or a list such as "
                          "cpu:0,cpu:1 or cuda:0,cuda:1")
    # The task's settings, overridden (fit takes them as the Task's).
    epochs: Optional[int] = option(None, "epochs (default: the recipe's; 10, or with --max-steps as many as its "
                                   "updates need)", Whole(1), fit=False)
    batch_size: Optional[int] = option(None, "global batch size, split over the devices", Whole(1), fit=False)
    lr: Optional[float] = option(None, "learning rate", Positive(), fit=False)
    optimizer: Optional[str] = option(None, f"{', '.join(OPTIMIZERS)}, or a torch.optim class as "
                                      f"torch.optim:AdamW (default: the recipe's)", check=_optimizer, fit=False,
                                      metavar="NAME")
    kvstore: Optional[str] = option(None, "where gradients are summed across devices (default: the recipe's; "
                                    "device)", check=_kvstore, fit=False,
                                    choices=["device", "local", "naive", "ring", "none"])
    allreduce: Optional[str] = option(None, "sum gradients across devices with the hand-written allreduce "
                                      "(lenet-scratch: naive)", Choice(ALGORITHMS, "allreduce algorithm"),
                                      fit=False)
    scale: bool = option(True, "resnet18: keep batch and lr as given instead of scaling them by the device count",
                         Switch(), flag="--no-scale", fit=False, action="store_false")
    # How.
    seed: int = option(0, "seed for initialisation and shuffling", Whole(0, below=2**63, parse=False))
    max_batches: Optional[int] = option(None, "stop each epoch after N batches (quick runs)", Whole(1),
                                        metavar="N")
    steps_per_epoch: Optional[int] = option(None, "a stream (IterableDataset): N batches an epoch, the stream running "
                                            "on across epochs (Keras's steps_per_epoch); without it, an epoch is a "
                                            "pass: its __len__ samples, or, without __len__, read to its end",
                                            Whole(1), metavar="N")
    max_steps: Optional[int] = option(None, "end the run after N updates in all, mid-epoch if there (that epoch is "
                                      "evaluated and saved), as Lightning's and Hugging Face's max_steps; the "
                                      "epochs, if given, still end it first if they come first", Whole(1),
                                      metavar="N")
    max_time: Optional[float] = option(None, "end the run after this long (counted from the job's start, "
                                       "$DPTRAIN_JOB_START, else the run's), at the next batch, mid-epoch if "
                                       "there (evaluated and saved): a job's time limit, as Lightning's "
                                       "max_time; --resume goes on from there", Duration(),
                                       metavar="SECONDS|[DD:]HH:MM:SS")
    dispatch_batches: bool = option(False, "several processes on a stream (an IterableDataset): rank 0 alone reads "
                                    "it and sends every process its part of each batch (Accelerate's "
                                    "dispatch_batches), instead of every process reading it whole", Switch())
    sharded_stream: bool = option(False, "several processes on streams sharded at their source (each process's "
                                  "stream its own share, as a DDP script's: split_dataset_by_node): a training "
                                  "batch is every process's next part; an evaluation reads each share to its end",
                                  Switch())
    log_every_n_steps: Optional[int] = option(None, "every N updates, the training loss over them (every device "
                                              "and process) and the learning rate: a line, TensorBoard scalars at "
                                              "the step, the result's step_history", Whole(1), metavar="N")
    eval_every_n_steps: Optional[int] = option(None, "also evaluate every N updates, mid-epoch too: the test "
                                               "figures join that step's row (--log-every-n-steps' rows)", Whole(1),
                                               metavar="N")
    eval_batches: Optional[int] = option(None, "evaluate on the first N test batches only", Whole(1), metavar="N")
    num_workers: int = option(0, "background processes reading a Dataset", Whole(0), metavar="N")
    worker_timeout: float = option(300.0, "with --num-workers: how long to wait for a batch from the data workers "
                                   "before naming the stuck one and ending the run", Positive(" of seconds"),
                                   metavar="S")
    sync_batchnorm: bool = option(False, "BatchNorm statistics over the whole batch, not per device", Switch(),
                                  flag="--sync-bn")
    amp: Optional[str] = option(None, "mixed precision (autocast) for the forward", Choice([None, "bf16", "fp16"],
                                                                                             "--amp"))
    compile: Optional[str] = option(None, "torch.compile every replica (MODE: default, reduce-overhead for CUDA "
                                    "graphs, max-autotune)", check=check_mode, metavar="MODE", nargs="?",
                                    const="default")
    channels_last: Optional[bool] = option(None, "NHWC memory format (default: on for CPU devices and with --amp)",
                                           action=argparse.BooleanOptionalAction)
    balance: Any = option("even", "split each batch over the devices (of every process) evenly, by measured speed, "
                          "or by fixed weights, one per device", check=parse_balance, metavar="even|auto|W,W,...")
    backend: str = option("auto", "torch.distributed backend (auto: nccl on GPUs, gloo on CPUs)",
                          Choice(BACKENDS, "backend"))
    bucket_cap_mb: float = option(DEFAULT_BUCKET_MB, "gradient bucket size for multi-process runs", Positive(),
                                  flag="--bucket-mb", metavar="MB")
    timeout: float = option(DEFAULT_TIMEOUT_S, "several processes: how long to wait for peers to join, or for a "
                            "silent one, before naming it and ending the job", Positive(" of seconds"), metavar="S")
    clip_grad_norm: Optional[float] = option(None, "clip the gradient to this norm before each update: the norm of "
                                             "the whole summed gradient, over every device and process, as "
                                             "clip_grad_norm_ on one device", Positive(), metavar="NORM")
    clip_grad_value: Optional[float] = option(None, "then clip every element of the summed gradient to [-V, V] "
                                              "before each update, as clip_grad_value_ on one device", Positive(),
                                              metavar="V")
    log_grad_norm: Any = option(False, "with --log-every-n-steps: each row also gives the norm of the whole "
                                "summed gradient of the update before it (before clipping; Hugging Face's "
                                "grad_norm); 'parameters': and each trainable parameter's (grad_norm/NAME)",
                                Choice([False, True, "parameters"], "--log-grad-norm", flag_choices=False),
                                nargs="?", const=True, choices=["parameters"], metavar="parameters")
    accumulate_grad_batches: int = option(1, "sum the gradients of N consecutive batches into each update: the "
                                          "update of an N-times larger batch, with the memory of one",
                                          Whole(1), metavar="N")
    shuffle: bool = option(True, "shuffle the training samples every epoch, by seed and epoch (--no-shuffle keeps "
                           "their order, as Keras's shuffle=False; a training DataLoader's own is taken "
                           "unless given)", Switch(), action=argparse.BooleanOptionalAction)
    drop_last: Optional[bool] = option(None, "drop each epoch's last training batch when it is smaller than the "
                                       "batch size (default: a DataLoader's drop_last, else keep it; evaluation "
                                       "reads every sample)", Switch(), action=argparse.BooleanOptionalAction)
    eval_batch_size: Optional[int] = option(None, "global batch size of the evaluations (default: an evaluation "
                                            "DataLoader's own, else --batch-size); no gradient is kept, so a "
                                            "larger one fits (as Keras's validation_batch_size)",
                                            Whole(1), metavar="N")
    eval_every: int = option(1, "evaluate after every N-th epoch only (and after the last, and one a stop "
                             "ended), as Keras's validation_freq", Whole(1), metavar="N")
    validation_split: Optional[float] = option(None, "hold out the last FRACTION of the training samples (taken "
                                               "before shuffling) as the evaluation set, as Keras's validation_split",
                                               check=check_fraction, metavar="FRACTION", type=float)
    train_metrics: bool = option(False, "also score the training batches as they are trained: train_acc and "
                                 "train_<metric> for every (sum, count) metric, beside the test ones", Switch())
    on_nan: str = option("stop", "a NaN/infinite loss stops the run, or skips that batch", Choice(["stop", "skip"],
                                                                                                   "--on-nan"))
    # Outputs.
    checkpoint_dir: Optional[str] = option(None, "save a checkpoint after every epoch (and on Ctrl-C/SIGTERM) in "
                                           "DIR", metavar="DIR")
    checkpoint_every: Optional[int] = option(None, "also save a checkpoint every N batches (bounds what a failure "
                                             "costs)", Whole(1), metavar="N")
    resume: bool = option(False, "continue from the checkpoint in --checkpoint-dir", Switch())
    overwrite: bool = option(False, "start over in a --checkpoint-dir, --metrics file, --trace file or --tensorboard "
                             "folder that holds another run's (refused otherwise)", Switch())
    metrics_file: Optional[str] = option(None, "write one JSON record per epoch to FILE (FILE.csv: a table)",
                                         flag="--metrics", metavar="FILE.jsonl")
    tensorboard: Optional[str] = option(None, "write TensorBoard scalars per epoch to DIR", metavar="DIR")
    trace: Optional[str] = option(None, "write a Chrome/Perfetto trace of a few steps: each device's forward, "
                                  "backward, gradient sum, update, and the data wait", metavar="FILE.json")
    trace_steps: int = option(10, "steps to trace", Whole(1), metavar="N")
    trace_from: int = option(3, "the first step traced, counted from 1 over the whole run (past the warm-up; "
                             "later to see the split --balance auto settles on)", Whole(1), metavar="STEP")
    progress: bool = option(True, "a progress bar on a terminal", Switch(), flag=None)

    def __post_init__(self) -> None:
        validate(self, fields(self))
        # Rules between settings.
        if (self.model is None) != (self.data is None):
            raise ValueError("--model and --data go together (your model on your data); give both")
        if self.loss is not None and self.model is None:
            raise ValueError("--loss goes with --model and --data; a recipe brings its own loss")
        if self.metric is not None and self.model is None:
            raise ValueError("--metric goes with --model and --data; a recipe brings its own metrics")
        named = self.metrics_file and self.metrics_file.lower() in (*ACCURACY, *ERRORS)
        if named:
            raise ValueError(f"--metrics takes a FILE for each epoch's figures (FILE.jsonl, or FILE.csv: a table), "
                             f"and {self.metrics_file!r} is a metric's name: with --model, give --metric "
                             f"{self.metrics_file} (fit: metrics=[{self.metrics_file!r}])")
        if self.checkpoint_every is not None and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir DIR (where to save)")
        if self.allreduce is not None:
            if self.kvstore is not None and self.kvstore != self.allreduce:
                raise ValueError(f"--allreduce {self.allreduce} and --kvstore {self.kvstore} both say how to sum "
                                 f"gradients: give one")
            self.kvstore = self.allreduce
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir DIR (where the checkpoint is)")
        if self.log_grad_norm and not self.log_every_n_steps:
            raise ValueError("--log-grad-norm goes with --log-every-n-steps N: its rows carry the norm (a callback "
                             "reads each update's as batch.result.grad_norm)")
        if self.sharded_stream and self.dispatch_batches:
            raise ValueError("--sharded-stream (each process reads its own share) and --dispatch-batches (rank 0 "
                             "reads for all) say two ways to read a stream: give one")
        if self.sharded_stream and self.balance != "even":
            raise ValueError("--sharded-stream does not go with --balance yet: use --balance even")
        if self.resume and self.overwrite:
            raise ValueError("--resume continues a run and --overwrite replaces it: give one")

    @property
    def max_norm(self) -> Optional[float]:
        """What each update clips the summed gradient's norm to: ``clip_grad_norm``, or, for
        ``log_grad_norm`` alone, infinity (the norm computed, nothing clipped)."""
        return self.clip_grad_norm if self.clip_grad_norm is not None else math.inf if self.log_grad_norm else None

    @property
    def amp_dtype(self):
        return AMP_DTYPES[self.amp]

    @property
    def kvstore_kind(self) -> Optional[str]:
        """The kvstore asked for ("none" is None); only meaningful when ``kvstore`` is set."""
        return None if self.kvstore is None or self.kvstore.lower() == "none" else self.kvstore.lower()

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TrainConfig":
        """Build a config from a dict; an unknown key is an error, not silently ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        return cls(**values)


def hyperparameters(task: Task, config: TrainConfig, n_devices: int) -> Tuple[Optional[int], int, Optional[float]]:
    """Return ``(epochs, batch_size, lr)``: the config's values, else the task's.

    ``epochs`` given nowhere is ``DEFAULT_EPOCHS``, or None with ``max_steps`` (as many as
    its updates need: ``Run`` counts them once it knows an epoch's batches).
    A per-device task (resnet18) multiplies its default batch and lr by the device count
    (the linear scaling rule) unless ``scale=False``; values given explicitly are global.
    ``lr`` None: the optimizer's own (several combined on one loss: refused, each has its own).
    Several optimizers: the settings they do not take yet are refused here (``engine/updates.py``).
    """
    if task.several:            # (before any device is measured or model placed)
        check_settings({name: getattr(config, name) for name in NOT_WITH_SEVERAL})
    if not config.scale and not task.per_device:
        raise ValueError(f"--no-scale applies to tasks whose batch and lr are per device (resnet18); "
                         f"{task.name}'s are global already")
    scale = n_devices if task.per_device and config.scale else 1
    lr = config.lr if config.lr is not None else (task.lr * scale if task.lr is not None else None)
    if lr is not None and isinstance(task.optimizer, CombinedOptimizer):
        raise ValueError(f"lr: not taken with several optimizers on one loss ({task.optimizer.label}): each keeps "
                         f"its own rate (Muon's and AdamW's differ); set it where each is built")
    epochs = config.epochs or task.epochs or (None if config.max_steps else DEFAULT_EPOCHS)
    return epochs, config.batch_size or task.batch_size * scale, lr
