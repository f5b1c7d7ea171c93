"""``--tensorboard DIR``: the per-epoch metrics as TensorBoard scalars (when it is installed)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict


#: A record's bookkeeping, not a figure of the epoch.
NOT_SCALARS = ("epoch", "world_size", "batches", "samples", "skipped")
#: A step row's bookkeeping: every other number in it is a figure (the loss, lr, grad_norm,
#: test_*, and a callback's own, added in ``on_train_log``).
STEP_NOT_SCALARS = ("step", "epoch", "batch", "steps")


def step_figures(row: Dict[str, Any]) -> Dict[str, float]:
    """The figures of a step row (what its line and TensorBoard show)."""
    return {k: v for k, v in row.items()
            if k not in STEP_NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardLog:
    """Write ``train_loss`` (and ``train_acc``...), ``test_acc``..., ``images_per_sec`` and ``sec`` per epoch to DIR."""

    def __init__(self, directory: str, fresh: bool = False):
        """``fresh``: remove the event files another run left in ``directory`` (``--overwrite``)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ValueError("--tensorboard needs the tensorboard package: pip install tensorboard "
                             "(or drop --tensorboard; --metrics FILE.jsonl needs nothing)") from None
        try:
            if fresh:
                for old in Path(directory).glob("events.out.tfevents.*"):
                    old.unlink()
            self.writer = SummaryWriter(log_dir=directory)
        except OSError as e:
            raise ValueError(f"cannot write TensorBoard logs to {directory}: {e.strerror}") from None

    def append(self, record: Dict[str, Any]) -> None:
        for key, value in record.items():       # the losses, every metric, the speed, a callback's own
            if key not in NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, record["epoch"])
        self.writer.flush()

    def append_step(self, row: Dict[str, Any]) -> None:
        """A ``log_every_n_steps`` row: ``step/train_loss``, ``step/lr`` (``step/grad_norm``
        with ``log_grad_norm``, ``step/test_*`` with ``eval_every_n_steps``, and a callback's
        own) at its step."""
        for key, value in step_figures(row).items():
            self.writer.add_scalar(f"step/{key}", value, row["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
