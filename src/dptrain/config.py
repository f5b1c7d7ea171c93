"""The typed configuration of a training run: one dataclass behind the CLI, validated once."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional

import torch

from .allreduce import ALGORITHMS
from .data.sources import SOURCES
from .distributed.env import BACKENDS
from .kvstore import KVSTORES
from .optim import check_optimizer

AMP_DTYPES = {None: None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainConfig:
    """Everything a run needs; ``None`` means "the recipe's default"."""
    recipe: str = "lenet-scratch"
    devices: str = "auto"
    epochs: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    seed: int = 0
    data_dir: Optional[str] = None
    max_batches: Optional[int] = None
    allreduce: str = "naive"
    optimizer: Optional[str] = None
    kvstore: Optional[str] = "device"
    sync_bn: bool = False
    eval_batches: Optional[int] = None
    amp: Optional[str] = None
    channels_last: Optional[bool] = None     # None: on for CPU devices and with --amp
    scale: bool = True
    dataset: Optional[str] = None
    backend: str = "auto"
    bucket_mb: float = 25.0
    checkpoint_dir: Optional[str] = None
    resume: bool = False
    metrics: Optional[str] = None
    progress: bool = True
    on_nan: str = "stop"
    tensorboard: Optional[str] = None

    def __post_init__(self) -> None:
        from .recipes import RECIPES   # recipes import this module
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown recipe {self.recipe!r}; choose one of {', '.join(RECIPES)}")
        for name in ("epochs", "batch_size", "max_batches", "eval_batches"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if self.allreduce not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {self.allreduce!r}; choose one of {', '.join(ALGORITHMS)}")
        if self.kvstore == "none":
            self.kvstore = None
        if self.kvstore not in KVSTORES:
            raise ValueError(f"unknown kvstore {self.kvstore!r}; choose one of device, local, none")
        if self.optimizer is not None:
            check_optimizer(self.optimizer)
        if self.amp not in AMP_DTYPES:
            raise ValueError(f"unknown --amp {self.amp!r}; choose one of {', '.join(k for k in AMP_DTYPES if k)}")
        if self.on_nan not in ("stop", "skip"):
            raise ValueError(f"unknown --on-nan {self.on_nan!r}; choose stop or skip")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir DIR (where the checkpoint is)")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise ValueError(f"bucket-mb must be a number > 0, got {self.bucket_mb!r}")
        if self.dataset is not None and self.dataset not in SOURCES:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(SOURCES)}")
        recipe = RECIPES[self.recipe]
        if not recipe.uses_trainer:
            given = [flag for flag, value, default in (
                ("--optimizer", self.optimizer, None), ("--kvstore", self.kvstore, "device"),
                ("--sync-bn", self.sync_bn, False), ("--amp", self.amp, None),
                ("--channels-last", self.channels_last, None)) if value != default]
            if given:
                trainer_recipes = ", ".join(r.name for r in RECIPES.values() if r.uses_trainer)
                raise ValueError(f"{', '.join(given)} do(es) not apply to {self.recipe}, which trains with "
                                 f"its own SGD and allreduce; use them with {trainer_recipes}")
        elif self.allreduce != "naive":
            raise ValueError(f"--allreduce applies to lenet-scratch only; {self.recipe} sums gradients "
                             f"with its Trainer (--kvstore)")

    @property
    def amp_dtype(self):
        return AMP_DTYPES[self.amp]

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TrainConfig":
        """Build a config from a dict; an unknown key is an error, not silently ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        return cls(**values)
