"""How a batch meets the model when nothing is compared with a target: ``predict``'s outputs,
and the forward passes that recompute BatchNorm's statistics (``callbacks/swa.py``).

    tensor x                  -> model(x)
    (x, y), (x1, x2, ..., y)  -> model(x), model(x1, x2, ...)   (the last item, a target, left out)
    (x,)                      -> model(x)
    {"input_ids": ..., "labels": ...} -> model(input_ids=...)   (or model(batch) whole: dict_inputs)
    a batch object of one's own (PyG's Batch) -> model(batch)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..data.batch import Batch
from ..data.batch_objects import own_object
from ..data.model_inputs import TARGET_KEYS, call_inputs
from .dict_inputs import call_with_dict


def model_input(model: nn.Module, batch: Batch) -> Any:
    """``model``'s output for ``batch``, its target left out (the table above)."""
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, (tuple, list)):
        return call_inputs(model, tuple(batch[:-1] if len(batch) > 1 else batch))
    if isinstance(batch, Mapping):          # (a UserDict too: Hugging Face's BatchEncoding)
        return call_with_dict(model, batch, {k: v for k, v in batch.items() if k not in TARGET_KEYS},
                              batch.get("labels"))      # (an encoder-decoder's decoder inputs, made from them)
    if own_object(batch):                   # (PyG's Batch: model(data))
        return model(batch)
    raise TypeError(f"predict cannot feed a batch of {type(batch).__name__} to the model: pass "
                    f"forward=fn(model, batch) -> output")
