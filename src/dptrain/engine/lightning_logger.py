"""The logger a ``LightningModule`` reads while ``fit`` writes TensorBoard (``tensorboard=DIR``):
Lightning's ``TensorBoardLogger`` as a module uses it, over the run's own ``SummaryWriter``, so
what the module writes there (``self.logger.experiment.add_image(...)``) lies beside fit's
scalars. Without ``tensorboard=``, the module's ``self.logger`` is None, as Lightning's with
``logger=False``.

    class Lit(L.LightningModule):
        def on_validation_epoch_end(self):
            self.logger.experiment.add_image("samples", grid, self.current_epoch)
            self.logger.log_metrics({"temperature": self.t}, step=self.global_step)

Rank 0 writes; in the other processes the experiment takes every call and does nothing, as
Lightning's ``rank_zero_experiment`` gives them.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

import torch


class BoardLogger:
    """``experiment`` (the run's ``SummaryWriter``; None: a process other than rank 0's, which
    gets ``Nothing``), ``log_dir``, ``save_dir``, ``name``, ``version``, ``log_metrics`` and
    ``log_hyperparams``."""

    name, version = "", 0

    def __init__(self, writer: Any, directory: str):
        self.experiment = writer if writer is not None else Nothing()
        self.log_dir = self.save_dir = self.root_dir = directory

    def log_metrics(self, metrics: Dict[str, Any], step: Optional[int] = None) -> None:
        for key, value in metrics.items():
            self.experiment.add_scalar(key, value.detach().item() if isinstance(value, torch.Tensor) else value, step)

    def log_hyperparams(self, params: Any, metrics: Any = None) -> None:
        """Written as a text summary, ``hparams`` (a dict, or an object whose ``vars`` are)."""
        params = params if isinstance(params, dict) else vars(params)
        self.experiment.add_text("hparams", json.dumps(params, indent=1, default=str))

    def save(self) -> None:
        """(Lightning's logger's; fit's writer is flushed every epoch and closed at the end.)"""

    def finalize(self, status: str) -> None:
        """(as ``save``)"""


class Nothing:
    """An experiment that takes every call and does nothing (a process other than rank 0's)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> "Nothing":
        return self
