"""The typed configuration of a training run: one dataclass behind the CLI, validated once."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional

from .allreduce import ALGORITHMS


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

    def __post_init__(self) -> None:
        from .recipes import RECIPES   # recipes import this module
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown recipe {self.recipe!r}; choose one of {', '.join(RECIPES)}")
        for name in ("epochs", "batch_size", "max_batches"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if self.allreduce not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {self.allreduce!r}; choose one of {', '.join(ALGORITHMS)}")

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TrainConfig":
        """Build a config from a dict; an unknown key is an error, not silently ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        return cls(**values)
