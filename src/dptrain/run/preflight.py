"""What a run checks before its first batch, so nothing fails, or is lost, after hours.

Every file and folder a run will write is tried first: the checkpoint folder (writable, room
for a checkpoint, and not holding another run's checkpoint unless ``--resume`` or
``--overwrite`` says what to do with it), the metrics file (never mixed with another run's
records), the TensorBoard folder, and the plot (matplotlib present, folder writable). The
``--processes`` launcher runs the same checks before starting any worker.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Dict, Optional, Union

from ..outputs.checkpoint import FILENAME, existing_checkpoint
from ..outputs.metrics_file import is_csv
from ..core.errors import CheckpointError

PathLike = Union[str, Path]


def _writable(folder: Path, what: str, error=ValueError) -> None:
    """Create ``folder`` if needed and write a temp file in it; a failure is one line."""
    for p in [folder, *folder.parents]:
        if p.exists():
            if not p.is_dir():
                raise error(f"cannot write {what}: {p} is a file, not a folder; pick another path")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dptrain-check-"):
            pass
    except OSError as e:
        raise error(f"cannot write {what}: {e.strerror or e} ({folder}); pick a writable path") from None


def _records(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def check_checkpoint_dir(directory: Optional[PathLike], resume: bool, overwrite: bool) -> None:
    if not directory:
        return
    directory = Path(directory)
    if resume:
        existing_checkpoint(directory)
    elif (directory / FILENAME).exists() and not overwrite:
        raise CheckpointError(f"{directory} already holds a checkpoint: continue that run with --resume, or pass "
                              f"--overwrite to replace it (or pick another --checkpoint-dir)")
    _writable(directory, f"checkpoints to {directory}", CheckpointError)


def check_space(directory: Optional[PathLike], needed_bytes: int) -> None:
    """Room for one checkpoint (the model, its optimizer state, and the temp copy's margin)."""
    if not directory:
        return
    free = shutil.disk_usage(directory).free
    old = (Path(directory) / FILENAME).stat().st_size if (Path(directory) / FILENAME).exists() else 0
    if free + old < needed_bytes:
        raise CheckpointError(f"{directory} has {free / 2**20:.1f} MiB free, and a checkpoint of this run needs about "
                              f"{needed_bytes / 2**20:.1f} MiB: free some space, or pick another --checkpoint-dir")


def check_regular(path: Optional[PathLike], flag: str) -> None:
    """An output file is a new path or a regular file: never a folder, a device, a FIFO or a
    socket (reading ``/dev/zero`` never ends; opening a FIFO waits for a reader)."""
    if not path or not os.path.lexists(path):
        return
    mode = os.stat(path).st_mode if os.path.exists(path) else 0
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise ValueError(f"{flag} {path} is {kind}: an output is a regular file, which dptrain writes whole; "
                         f"give a new file name")


def check_distinct(outputs: Dict[str, Optional[PathLike]]) -> None:
    """No two outputs on one path: one would destroy the other."""
    seen: Dict[str, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise ValueError(f"{seen[key]} and {flag} both write {path}: give each its own path")
        seen[key] = flag


def check_trace(path: Optional[PathLike], overwrite: bool) -> None:
    if not path:
        return
    check_regular(path, "--trace")
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"--trace {path} already exists: pass --overwrite to replace it (or --resume, the run that "
                         f"wrote it), or pick another file")
    _writable(Path(path).parent, f"the trace {path}")


def check_metrics_file(path: Optional[PathLike], resume: bool, overwrite: bool) -> None:
    if not path:
        return
    check_regular(path, "--metrics")
    path = Path(path)
    n = max(0, _records(path) - is_csv(path)) if path.exists() else 0        # (a table's header is no record)
    if n and not resume and not overwrite:
        raise ValueError(f"{path} already holds {n} record(s) of another run: pass --resume to continue that run, "
                         f"--overwrite to replace them, or write to another file")
    _writable(path.parent, f"the metrics file {path}")


def check_tensorboard(directory: Optional[PathLike], resume: bool, overwrite: bool) -> None:
    if not directory:
        return
    directory = Path(directory)
    events = list(directory.glob("events.out.tfevents.*")) if directory.is_dir() else []
    if events and not resume and not overwrite:
        raise ValueError(f"{directory} already holds TensorBoard logs of another run: pass --resume to continue "
                         f"that run, --overwrite to replace them, or use another folder")
    _writable(directory, f"TensorBoard logs to {directory}")
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise ValueError("--tensorboard needs the tensorboard package: pip install tensorboard "
                         "(or drop --tensorboard; --metrics FILE.jsonl needs nothing)") from None


def check_plot(path: Optional[PathLike]) -> None:
    if not path:
        return
    check_regular(path, "--plot")
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"--plot {path}: the file must end in .png, .svg or .pdf")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib (or dptrain[plot]), or drop --plot "
                         "(dptrain plot draws a --metrics file later)") from None
    _writable(path.parent, f"the plot {path}")


def check_outputs(config, plot: Optional[PathLike] = None) -> None:
    """Every output of a run described by ``config`` (a ``TrainConfig``), before it starts."""
    check_distinct({"--checkpoint-dir": config.checkpoint_dir, "--metrics": config.metrics_file,
                    "--tensorboard": config.tensorboard, "--trace": config.trace, "--plot": plot})
    check_trace(config.trace, config.overwrite or config.resume)      # a resumed run rewrites its own
    check_checkpoint_dir(config.checkpoint_dir, config.resume, config.overwrite)
    check_metrics_file(config.metrics_file, config.resume, config.overwrite)
    check_tensorboard(config.tensorboard, config.resume, config.overwrite)
    check_plot(plot)
