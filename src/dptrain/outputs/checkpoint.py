"""Checkpoints: saved atomically, checked against a digest, loaded without running code.

A save writes a temp file in the same folder, fsyncs it, and renames it over the old one:
a process killed mid-save leaves the previous checkpoint whole, and a failed write (a full
disk) is one line that says so. Every checkpoint carries a BLAKE2b digest of its contents
(every tensor's bytes, every value), checked on load: a file changed since it was written
(flipped bits, an edit) is refused instead of trained on. Loading uses
``torch.load(weights_only=True)``, which accepts tensors, numbers, strings, lists and dicts
only: a checkpoint cannot execute code.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch

from ..core.atomic import atomic_file
from ..core.errors import CheckpointError

FORMAT = "dptrain-checkpoint-2"
FILENAME = "checkpoint.pt"



def checkpoint_path(directory: Union[str, Path]) -> Path:
    return Path(directory) / FILENAME


def digest(value: Any) -> str:
    """A BLAKE2b digest of a checkpoint's contents: every tensor's dtype, shape and bytes, and
    every other value, walked in a fixed order (~1 GB/s)."""
    h = hashlib.blake2b(digest_size=16)

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v, key=repr):
                h.update(repr(k).encode())
                walk(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for x in v:
                walk(x)
            h.update(b"]")
        else:
            h.update(repr(v).encode())
    walk(value)
    return h.hexdigest()


def save_checkpoint(directory: Union[str, Path], state: Dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pt`` atomically, with its digest; return the path.

    A failed write is a ``CheckpointError`` (one line); the previous checkpoint is kept."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint directory {directory}: {e.strerror}; "
                              f"pick a writable --checkpoint-dir") from None
    path = directory / FILENAME
    try:
        with atomic_file(path) as f:
            torch.save({"format": FORMAT, "digest": digest(state), **state}, f)
    except OSError as e:
        kept = "the previous checkpoint is kept" if path.exists() else "no checkpoint was written"
        raise CheckpointError(f"could not write the checkpoint {path}: {e.strerror or e} ({kept}); free some "
                              f"space, or pick another --checkpoint-dir") from None
    return path


def existing_checkpoint(directory: Union[str, Path]) -> Path:
    """``directory/checkpoint.pt``, or a one-line error saying it is not there to resume from."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist; run once with "
                              f"--checkpoint-dir {directory} before --resume")
    path = directory / FILENAME
    if not path.is_file():
        raise CheckpointError(f"no checkpoint in {directory} (expected {FILENAME}); run with "
                              f"--checkpoint-dir {directory} first, or drop --resume")
    return path


def load_checkpoint(directory: Union[str, Path]) -> Dict[str, Any]:
    """Read ``directory/checkpoint.pt``; a missing, truncated or foreign file is a one-line error."""
    path = existing_checkpoint(directory)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is corrupt or truncated, or not a dptrain checkpoint ({first[:120]}); "
                              f"delete it to start over") from None
    if isinstance(state, dict) and isinstance(state.get("format"), str) \
            and state["format"].startswith("dptrain-checkpoint-") and state["format"] != FORMAT:
        raise CheckpointError(f"{path} was written by another version of dptrain ({state['format']}, this one reads "
                              f"{FORMAT}): start a new run in another --checkpoint-dir")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a dptrain checkpoint (expected format {FORMAT})")
    saved = state.pop("digest", None)
    state.pop("format")
    if saved != digest(state):
        raise CheckpointError(f"{path} is corrupt: its contents do not match the digest written with them (the file "
                              f"changed after it was saved); resume from a copy, or delete it to start over")
    return state


def peek_identity(directory: Union[str, Path, None]) -> Optional[Dict[str, Any]]:
    """What the run that saved ``directory``'s checkpoint was (its ``identity``), read without
    loading the tensors (memory-mapped); None if there is no readable one (``load_checkpoint``
    says why when the run resumes)."""
    if directory is None or not checkpoint_path(directory).is_file():
        return None
    try:
        state = torch.load(checkpoint_path(directory), map_location="cpu", weights_only=True, mmap=True)
        return json.loads(state["identity"])
    except Exception:       # noqa: BLE001 - the resume itself reports what is wrong
        return None
