"""Checkpoints: saved atomically, loaded without running code from the file.

A save writes a temp file in the same folder, fsyncs it, and renames it over the old one:
a process killed mid-save leaves the previous checkpoint whole. Loading uses
``torch.load(weights_only=True)``, which accepts tensors, numbers, strings, lists and dicts
only: a checkpoint cannot execute code.
"""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any, Dict, Union

import torch

from .atomic import atomic_file

FORMAT = "dptrain-checkpoint-1"
FILENAME = "checkpoint.pt"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or of another run."""


def checkpoint_path(directory: Union[str, Path]) -> Path:
    return Path(directory) / FILENAME


def save_checkpoint(directory: Union[str, Path], state: Dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pt`` atomically; return the path."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {directory}: {e.strerror}; "
                              f"pick a writable --checkpoint-dir") from None
    path = directory / FILENAME
    with atomic_file(path) as f:
        torch.save({"format": FORMAT, **state}, f)
    return path


def load_checkpoint(directory: Union[str, Path]) -> Dict[str, Any]:
    """Read ``directory/checkpoint.pt``; a missing, truncated or foreign file is a one-line error."""
    directory = Path(directory)
    path = directory / FILENAME
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist; run once with "
                              f"--checkpoint-dir {directory} before --resume")
    if not path.is_file():
        raise CheckpointError(f"no checkpoint in {directory} (expected {FILENAME}); run with "
                              f"--checkpoint-dir {directory} first, or drop --resume")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is corrupt or truncated, or not a dptrain checkpoint ({first[:120]}); "
                              f"delete it to start over") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a dptrain checkpoint (expected format {FORMAT})")
    return state
