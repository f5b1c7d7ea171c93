"""The typed configuration of a training run: one dataclass behind the CLI, validated once.

A ``TrainConfig`` says *how* to train (devices, epochs, checkpoints...); *what* to train is a
``Task`` (``task.py``), given by a recipe: a built-in name, ``pkg.module:factory`` or
``file.py:factory`` (a function ``(config) -> Task``), or ``--model``/``--data`` factories.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

import torch

from ..data.sources import SOURCES
from ..distributed.env import BACKENDS
from ..engine.balance import parse_balance
from ..engine.compiled import check_mode
from ..engine.task import Task
from ..parallel.optim import OPTIMIZERS
from ..parallel.sync import KVSTORES
from ..scratch.allreduce import ALGORITHMS

AMP_DTYPES = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


def is_import_spec(text: Optional[str]) -> bool:
    """``pkg.module:name`` or ``path/file.py:name`` (what ``imports.load_object`` reads)."""
    return isinstance(text, str) and ":" in text


@dataclass
class TrainConfig:
    """Everything a run needs besides its Task; ``None`` means "the task's default"."""
    recipe: str = "lenet-scratch"
    model: Optional[str] = None         # pkg.module:factory -> nn.Module (with data: your own task)
    data: Optional[str] = None          # pkg.module:factory -> train data, or (train, eval)
    loss: Optional[str] = None          # a loss name or pkg.module:name, with model and data
    devices: Any = "auto"             # "auto", a count, "cpu:0,cpu:1", or a list of devices
    epochs: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    seed: int = 0
    data_dir: Optional[str] = None
    max_batches: Optional[int] = None
    allreduce: Optional[str] = None     # the from-scratch allreduce: kvstore "naive" or "ring"
    optimizer: Optional[str] = None
    kvstore: Optional[str] = None
    sync_bn: bool = False
    eval_batches: Optional[int] = None
    amp: Optional[str] = None
    compile: Optional[str] = None       # a torch.compile mode ("default", "reduce-overhead", ...), None: eager
    channels_last: Optional[bool] = None     # None: where the task's model gains (CPU devices, --amp)
    scale: bool = True
    dataset: Optional[str] = None
    num_workers: int = 0
    backend: str = "auto"
    bucket_mb: float = 25.0
    timeout: float = 60.0               # seconds to wait for peers to join, or for a silent peer
    balance: Any = "even"               # "even", "auto", or one weight per device: who computes what
    trace: Optional[str] = None         # a Chrome trace of a few steps, to this file
    trace_steps: int = 10
    trace_from: int = 3                 # the first step traced, counted from 1 over the run
    checkpoint_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None   # batches between saves within an epoch
    resume: bool = False
    overwrite: bool = False             # replace another run's checkpoint, metrics, TensorBoard logs
    metrics_file: Optional[str] = None
    progress: bool = True
    on_nan: str = "stop"
    tensorboard: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.model is None) != (self.data is None):
            raise ValueError("--model and --data go together (your model on your data); give both")
        if self.loss is not None and self.model is None:
            raise ValueError("--loss goes with --model and --data; a recipe brings its own loss")
        if self.checkpoint_every is not None and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir DIR (where to save)")
        for name in ("epochs", "batch_size", "max_batches", "eval_batches", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be a whole number in [0, 2**63), got {self.seed!r}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num-workers must be a whole number >= 0, got {self.num_workers!r}")
        if self.allreduce is not None:
            if self.allreduce not in ALGORITHMS:
                raise ValueError(f"unknown allreduce algorithm {self.allreduce!r}; choose one of "
                                 f"{', '.join(ALGORITHMS)}")
            if self.kvstore is not None and self.kvstore != self.allreduce:
                raise ValueError(f"--allreduce {self.allreduce} and --kvstore {self.kvstore} both say how to sum "
                                 f"gradients: give one")
            self.kvstore = self.allreduce
        if self.kvstore is not None and self.kvstore.lower() not in ("none",) + tuple(k for k in KVSTORES if k):
            raise ValueError(f"unknown kvstore {self.kvstore!r}; choose one of device, local, naive, ring, none")
        if self.optimizer is not None:
            if not is_import_spec(self.optimizer) and self.optimizer.lower() not in OPTIMIZERS:
                raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}, or "
                                 f"a class such as torch.optim:AdamW")
        self.balance = parse_balance(self.balance)
        for name in ("trace_steps", "trace_from"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        self.compile = check_mode(self.compile)
        if self.amp not in AMP_DTYPES:
            raise ValueError(f"unknown --amp {self.amp!r}; choose one of {', '.join(k for k in AMP_DTYPES if k)}")
        if self.on_nan not in ("stop", "skip"):
            raise ValueError(f"unknown --on-nan {self.on_nan!r}; choose stop or skip")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir DIR (where the checkpoint is)")
        if self.resume and self.overwrite:
            raise ValueError("--resume continues a run and --overwrite replaces it: give one")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if not (isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {self.timeout!r}")
        if not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise ValueError(f"bucket-mb must be a number > 0, got {self.bucket_mb!r}")
        if self.dataset is not None and self.dataset not in SOURCES:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(SOURCES)}")

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


def hyperparameters(task: Task, config: TrainConfig, n_devices: int) -> Tuple[int, int, Optional[float]]:
    """Return ``(epochs, batch_size, lr)``: the config's values, else the task's.

    A per-device task (resnet18) multiplies its default batch and lr by the device count
    (the linear scaling rule) unless ``scale=False``; values given explicitly are global.
    ``lr`` None: the optimizer's own.
    """
    if not config.scale and not task.per_device:
        raise ValueError(f"--no-scale applies to tasks whose batch and lr are per device (resnet18); "
                         f"{task.name}'s are global already")
    scale = n_devices if task.per_device and config.scale else 1
    lr = config.lr if config.lr is not None else (task.lr * scale if task.lr is not None else None)
    return config.epochs or task.epochs, config.batch_size or task.batch_size * scale, lr
