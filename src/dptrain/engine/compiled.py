"""``--compile``: every replica's forward (and so its backward) through ``torch.compile``.

Each replica gets its own ``torch.compile`` wrapper over the same module object: parameters,
gradients, hooks, checkpoints are the module's, unchanged (a checkpoint written with
``--compile`` loads without it and back; keys with ``torch.compile``'s ``_orig_mod.``
prefix, from a compiled module saved elsewhere, load too). Compiling happens before the
first epoch, on every shard size the epoch will see (a full shard, and the last batch's),
one replica after the other, so its time is reported on its own and not inside an epoch.

Measured on the 2-core CPU here (benchmarks/RESULTS.md): inductor's CPU kernels for these
small convnets are slower than oneDNN's in eager mode, so compiling is off by default; the
GPU suite measures it on GPUs, with ``mode="reduce-overhead"`` (CUDA graphs) for models
whose steps are bound by kernel launches.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PREFIX = "_orig_mod."


def check_mode(mode) -> Optional[str]:
    """``None``/``False``: eager; ``True``: ``"default"``; else one of ``MODES``."""
    if mode in (None, False, "off", "none"):
        return None
    if mode is True:
        return "default"
    if mode not in MODES:
        raise ValueError(f"unknown compile mode {mode!r}; choose one of {', '.join(MODES)}")
    if not hasattr(torch, "compile"):
        raise ValueError("--compile needs torch.compile (PyTorch 2.0 or newer)")
    return mode


def compile_replicas(modules: Sequence[nn.Module], mode: str) -> List[nn.Module]:
    """One ``torch.compile`` wrapper per replica (the replicas themselves are untouched)."""
    return [torch.compile(m, mode=mode) for m in modules]


def warm_up(steps: Sequence[Callable[[], None]]) -> float:
    """Run each compiling call once, one after another (compiling is not done from several
    threads at once); return the seconds it took."""
    start = time.perf_counter()
    for step in steps:
        step()
    return time.perf_counter() - start


def without_prefix(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A state dict saved from a ``torch.compile`` wrapper, with its keys as the module's."""
    if not any(k.startswith(PREFIX) for k in state):
        return state
    return {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in state.items()}
