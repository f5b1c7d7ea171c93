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
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..core.parts import even_parts
from ..core.modes import evaluating
from ..data.batch import Batch, batch_size, split_structure, to_device

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


def compile_engine(engine: Any, example: Batch) -> float:
    """Compile every replica of ``engine`` on ``example`` (a batch of this process, with the
    sizes of an epoch's shards): a training and an evaluation call on each device, one after
    another (compiling is not done from several threads at once), each on its device's own
    thread, as training runs them (dynamo's guards include the thread's intra-op thread
    count). The model is left as it was (BatchNorm statistics, the random state, the
    gradients); returns the seconds it took."""
    if engine._nets is None:
        engine._nets = compile_replicas(list(engine.replicas), engine.compile_mode)
    n = batch_size(example)
    k = min(n, len(engine.devices))
    shards = split_structure(example, even_parts(n, k)) if k > 1 else [example]

    def shard_loss(i: int, shard: Batch) -> torch.Tensor:
        device = engine.devices[i]
        return engine._loss(engine._net(i), to_device(shard, device, engine.memory_format), device, count=False)[0]

    def train(i: int, shard: Batch) -> None:
        with torch.enable_grad():
            value = shard_loss(i, shard)
        value.backward()

    def evaluate(i: int, shard: Batch) -> None:
        with evaluating(engine.replicas[i]), torch.no_grad():
            shard_loss(i, shard)
    buffers = [[b.clone() for b in m.buffers()] for m in engine.replicas]
    rng = torch.get_rng_state()
    start = time.perf_counter()
    with engine.trainer.no_sync():                # nothing sent: these gradients are thrown away
        for f in (train, evaluate):
            for i, shard in enumerate(shards):
                engine.runner.run(i, f, i, shard)
    seconds = time.perf_counter() - start
    engine.trainer.discard_gradients()
    torch.set_rng_state(rng)
    with torch.no_grad():
        for m, saved in zip(engine.replicas, buffers):
            for b, v in zip(m.buffers(), saved):
                b.copy_(v)
    return seconds


def without_prefix(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A state dict saved from a ``torch.compile`` wrapper, with its keys as the module's."""
    if not any(k.startswith(PREFIX) for k in state):
        return state
    return {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in state.items()}
