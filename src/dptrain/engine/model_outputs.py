"""What a model or a step function returned, as the loss and the metrics read it.

A model returns a tensor, or a Hugging Face ``ModelOutput`` (a dict with ``logits``), an
object of one's own with ``.logits`` (a dataclass), a dict of heads or a tuple; the loss
compares the tensor or the ``logits`` with the target (``loss_input``), and a loss of the
user's own gets any other output whole. A step function returns its loss, ``(sum, count)``,
or a dict or object with ``loss`` (and ``logits`` for the metrics: ``read_step``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Tuple

import torch

from ..data.batch import map_tensors

if TYPE_CHECKING:
    from .losses import LossAdapter


def loss_input(output: Any, whole: bool = False) -> Any:
    """What the loss compares with the target: the output itself, or the ``logits`` of a
    dict-like output (a Hugging Face ``ModelOutput``) or of an object (a dataclass of one's own,
    as ``.logits``). Any other dict, and a tuple, go
    ``whole`` to a loss of the user's own (a multi-task model's heads, ``(logits, aux)``);
    a torch loss needs a tensor, and the error names the fix. bf16/fp16 outputs (autocast)
    are widened to float32: the loss sums stay exact."""
    if isinstance(output, torch.Tensor):
        return output.float() if output.dtype in (torch.bfloat16, torch.float16) else output
    if isinstance(output, Mapping):
        if output.get("logits") is not None:
            return loss_input(output["logits"])
        if whole:
            return map_tensors(loss_input, output)
        raise TypeError(f"the model returned a dict with keys {', '.join(map(str, output))}, not a tensor, and no "
                        f"'logits' to compare with the target: pass forward=lambda model, batch: "
                        f"(model(...)[KEY], target), a loss of your own (it gets the whole dict: "
                        f"loss=fn(output, target)), or step=lambda model, batch: model(**batch)['loss'] when the "
                        f"model computes its own loss")
    if isinstance(output, (tuple, list)):
        if whole:
            return map_tensors(loss_input, output)
        raise TypeError(f"the model returned a {type(output).__name__} of {len(output)}, not a tensor: pass "
                        f"forward=lambda model, batch: (model(batch[0])[0], batch[1]) to say which output the loss compares, "
                        f"or a loss of your own (it gets the whole {type(output).__name__}: loss=fn(output, target))")
    if isinstance(getattr(output, "logits", None), torch.Tensor):     # an output object (a dataclass)
        return loss_input(output.logits)
    if not whole and output is not None:
        raise TypeError(f"the model returned a {type(output).__name__}, not a tensor, and no tensor 'logits' to "
                        f"compare with the target: pass forward=lambda model, batch: (model(batch[0]).FIELD, "
                        f"batch[1]), or a loss of your own (it gets the whole output: loss=fn(output, target))")
    return output


def output_for(adapter: Optional["LossAdapter"], output: Any) -> Any:
    """``loss_input`` for ``adapter``'s loss: the output whole for a loss of the user's own,
    or for none (a step function's output, for the metrics). A classification loss given a
    model output's logits is told so (``LossAdapter.classes_last``)."""
    if adapter is not None and adapter.classification and not isinstance(output, torch.Tensor):
        adapter.from_model_output = True
    return loss_input(output, adapter is None or not adapter.known)


def read_step(out: Any) -> Tuple[Any, Any]:
    """What a step function returned: ``(loss or (sum, count), output or None)``. A dict (a
    Hugging Face ``ModelOutput``: ``step=lambda model, batch: model(**batch)``) gives its
    ``loss`` (with its ``count``, if it has one) and its ``logits`` (or ``output``) for metrics;
    an object with a tensor ``loss`` attribute (a dataclass of one's own) its ``.loss`` and ``.logits``."""
    if type(out) is torch.Tensor:       # (the usual: no ABC check)
        return out, None
    if not isinstance(out, Mapping):
        if isinstance(getattr(out, "loss", None), torch.Tensor):      # an output object (a dataclass)
            return out.loss, getattr(out, "logits", None)
        return out, None
    if out.get("loss") is None:
        raise ValueError(f"step returned a dict with keys {', '.join(map(str, out))} and no 'loss': return the loss, "
                         f"(sum, count), or a dict with 'loss' (and 'logits' for metrics); a Hugging Face model "
                         f"computes its loss when the batch holds its 'labels'")
    loss = (out["loss"], out["count"]) if out.get("count") is not None else out["loss"]
    return loss, out.get("logits", out.get("output"))
