"""``dptrain.predict``: a model's outputs for every sample, in the data's order, computed on
every device and process.

Each global batch is cut over the processes and then over their devices in consecutive
parts (``core/parts.py``), so the outputs gathered in (batch, process, device) order are the
samples' order, every sample once, whatever the device and process counts.

    outputs = dptrain.predict(model, test_set)               # a tensor (or the model's structure)
    classes = dptrain.predict(model, X).argmax(1)
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Callable, List, Optional, Sequence, Union

import torch
from torch import nn

from ..core.modes import evaluating
from ..core.parts import even_parts
from ..core.stage import stage
from ..core.runner import get_runner
from ..data.batch import Batch, batch_size as size_of, join_structure, map_tensors, split_structure, to_device
from ..data.choose_loader import lists_as_columns, make_loader, reading_batch_size
from ..distributed.env import DEFAULT_TIMEOUT_S
from ..engine.batch_call import model_input
from ..engine.forward_hooks import user_hooks
from ..engine.lightning_adopt import predict_step_of, staged
from ..engine.lightning_predict_hooks import PredictHooks
from ..engine.lightning_transfer import before_transfer_of, transfer_of
from ..parallel.given_model import unwrapped
from ..parallel.replicas import replicate
from .float64_data import float64_named
from .flag_words import keyword_errors
from .keywords import PREDICT_PEERS, keywords_checked
from .lightning_data import is_data_module, stage_data
from .session import ALL_CALL, inference_job

def batch_loss_left_out(output: Any, ignored: Sequence[str] = ()) -> Any:
    """A dict output's ``loss`` of the batch (a 0-dim tensor: not a sample's) as None, as a
    Hugging Face model gives it without labels: a forward given the batch whole computes it.
    ``ignored``: the keys its config says to leave out at inference (``keys_to_ignore_at_inference``:
    a causal LM's ``past_key_values``, a cache object, not joined sample by sample), None too,
    as the Trainer's ``predict`` leaves them out."""
    if not isinstance(output, Mapping):
        return output
    gone = [k for k in ignored if output.get(k) is not None]
    if isinstance(output.get("loss"), torch.Tensor) and output["loss"].dim() == 0:
        gone.append("loss")
    if gone:
        output = copy.copy(output)
        for k in gone:
            output[k] = None
    return output


def ignored_at_inference(model: nn.Module) -> Sequence[str]:
    """The output keys a Hugging Face model (one with a ``config``) leaves out at inference: its
    config's ``keys_to_ignore_at_inference``, else its cache (transformers 5 names none); none
    for other models."""
    config = getattr(model, "config", None)
    if config is None:
        return ()
    keys = getattr(config, "keys_to_ignore_at_inference", None)
    return tuple(k for k in keys if isinstance(k, str)) if isinstance(keys, (list, tuple)) else \
        ("past_key_values", "cache")


def concatenate(parts: List[Any]) -> Any:
    """Outputs of consecutive parts of the data joined along the first axis, keeping their
    structure (``batch.join_structure``: tensors in tuples, namedtuples, dicts, dataclasses)."""
    try:
        return join_structure(parts)
    except TypeError as e:
        raise TypeError(f"predict joins the model's outputs part by part: {e}; pass forward=fn(model, batch) "
                        f"-> the outputs of the batch's samples, e.g. forward=lambda model, x: model(x)[0]") from None


@keyword_errors
@keywords_checked(PREDICT_PEERS)
@torch.no_grad()
def predict(model: nn.Module, data: Any, *, batch_size: Optional[int] = None, devices: Union[str, int, Sequence[Any]] = "auto",
            forward: Optional[Callable[[nn.Module, Any], Any]] = None, collate_fn: Optional[Callable] = None,
            num_workers: int = 0, dispatch_batches: bool = False, sharded_stream: bool = False,
            local: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Return ``model``'s outputs for every sample of ``data``, in order (on the CPU).

    ``data``: what ``fit`` takes (tensors, ``(X, y)``, a dict of tensors, a ``Dataset``, a
    ``DataLoader``); a target in it is left out (``engine/batch_call.py``). ``batch_size``: global
    (default: a ``DataLoader``'s own, else 256). ``forward(model,
    batch) -> output`` when a batch meets the model otherwise; with none, a LightningModule's
    own ``predict_step(batch, batch_idx)`` gives each batch's outputs (Lightning's
    ``trainer.predict``; the batch as the loader gives it, a target too). In eval mode, without
    gradients; the model's mode is restored. ``devices``: ``auto`` is every GPU, else one
    CPU device (``session.inference_devices``: virtual devices slow a forward pass down);
    a count or a list as ``fit``'s. With several processes (``WORLD_SIZE`` > 1) every
    process computes its part and gets all the outputs; a stream is read whole by each, or by
    rank 0 alone with ``dispatch_batches``, which sends the others their parts. ``sharded_stream``: each process's
    stream (an ``IterableDataset``) is its own share, read to its end, and each gets its
    share's outputs, in its order (as a DDP script's predictions; None for an empty share).
    ``local=True``: this process alone predicts every sample, with no other process (a
    script's ``if rank == 0:``, writing the predictions), on its own devices.

    >>> dptrain.predict(model, (X, y), devices=2).shape     # half the batch on cpu:0, half on cpu:1
    torch.Size([1000, 10])
    """
    env, devices, collective = inference_job(devices, timeout, dispatch_batches, sharded_stream, local)
    # A LightningDataModule's data (trainer.predict); float64 arrays named in a dtype error.
    data = lists_as_columns(data)       # ((X, labels_list): a list column made a tensor)
    module_data = data if is_data_module(data) else None
    with float64_named(model, data), stage_data(data, "predict", local) as data, \
            staged(model, "predict", datamodule=module_data) as trainer:     # (an on_after_batch_transfer's stage)
        loader = make_loader(data, reading_batch_size(data, batch_size), num_workers=num_workers, collate_fn=collate_fn, rank=env.rank,
                             world_size=env.world_size, dispatch=dispatch_batches, sharded=sharded_stream,
                             to_the_end=True)
        model = unwrapped(model)
        replicas = replicate(model, devices)
        own = predict_step_of(model) if forward is None else None      # a LightningModule's predict_step
        moved = transfer_of(model, module_data) if forward is None else None
        before = before_transfer_of(model, module_data) if forward is None else None     # (on the whole batch)
        # (its on_predict_* hooks, where trainer.predict calls them; none with a forward of yours)
        hooks: Optional[PredictHooks] = PredictHooks(model, list(replicas), replicas.devices[0]) \
            if forward is None else None
        hooks = hooks if hooks else None       # (none overridden: nothing asked a batch)
        runner, feed = get_runner(replicas.devices), forward or model_input
        ignored = ignored_at_inference(model)       # (a causal LM's cache)
        hooked = len(replicas.devices) > 1 and bool(user_hooks(model))      # (forward_hooks.py)
        outputs: List[Any] = []
        index = 0                           # the batch's (a predict_step's batch_idx)

        def shard_output(i: int, shard: Optional[Batch]) -> Any:
            if shard is None:               # a device with no sample in a small last batch
                return None
            shard = to_device(shard, replicas.devices[i])
            if moved is not None:           # (its on_after_batch_transfer, on the part on its device)
                shard = moved(replicas[i], shard, trainer)
            if hooks is None:
                out = own(replicas[i], shard, index) if own is not None else feed(replicas[i], shard)
            else:
                out = hooks.around(replicas[i], shard, index, lambda: own(replicas[i], shard, index)
                                   if own is not None else feed(replicas[i], shard))
            return map_tensors(lambda t: t.detach().cpu(), batch_loss_left_out(out, ignored))
        try:
            with evaluating(*replicas), runner.coordinating():     # each module's own mode back after
                if hooks is not None:
                    hooks.start()
                for index, batch in enumerate(loader):
                    n = size_of(batch)
                    if n == 0:                  # this process's part of a last batch smaller than the processes
                        outputs.append(None)
                        continue
                    if before is not None:      # (a LightningModule's on_before_batch_transfer)
                        batch = before(batch, trainer, "predict")
                    k = min(n, len(replicas.devices))
                    if k == 1:
                        outputs.append(shard_output(0, batch))
                        continue
                    shards = split_structure(batch, even_parts(n, k)) + [None] * (len(replicas.devices) - k)
                    parts = [shard_output(i, s) for i, s in enumerate(shards)] if hooked else \
                        runner.map(shard_output, shards)        # (forward hooks of yours: in device order)
                    outputs.append(concatenate(parts[:k]))
                if hooks is not None:
                    hooks.end()
        finally:
            if hasattr(loader, "close"):
                loader.close()
        if getattr(loader, "sharded", False):          # this process's share: its outputs alone
            mine = [part for part in outputs if part is not None]
            return concatenate(mine) if mine else None
        with stage(ALL_CALL.format("predicting", "predict")):
            per_rank = collective.all_gather_object(outputs) if env.distributed else [outputs]
        ordered = [part for b in range(len(outputs)) for part in (r[b] for r in per_rank) if part is not None]
        return concatenate(ordered)

