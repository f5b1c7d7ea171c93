"""How a dict batch meets the model: ``model(**batch)`` without its target (a Hugging Face
model's ``input_ids=``, ``attention_mask=``), or, for a forward of one argument that takes
none of the keys by name (research code's ``def forward(self, batch)``), ``model(batch)``
with the batch whole, its target too (the forward reads ``batch["y"]`` for its own loss).

The second way is taken when the first fails on a keyword before the forward runs, and the
batch given whole then works: so a model that takes its inputs by name never gets a dict,
and the choice, made once per model class and keys, costs a dict lookup a step after that::

    call_with_dict(model, {"x": X, "y": y}, {"x": X})    # model(x=X), or model({"x": X, "y": y})

An encoder-decoder model (Hugging Face's T5, BART) given no ``decoder_input_ids`` makes them
from its labels when it gets them; here it gets none (they are the target), so they are made
as its own forward would, by its ``prepare_decoder_input_ids_from_labels`` (what the
``DataCollatorForSeq2Seq`` given the model does); it failed on "You must specify exactly one
of input_ids or inputs_embeds", said of its decoder.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Dict, Tuple

from torch import nn

#: (model class, the batch's keys) whose forward takes the batch whole.
_WHOLE: Dict[Tuple[type, Tuple[Any, ...]], bool] = {}
#: Model classes that make their decoder's inputs from the labels (an encoder-decoder's).
_DECODES: Dict[type, bool] = {}
_DECODER_INPUTS = ("decoder_input_ids", "decoder_inputs_embeds")


def with_decoder_inputs(model: Any, kwargs: Dict[str, Any], target: Any) -> Dict[str, Any]:
    """``kwargs`` with the ``decoder_input_ids`` an encoder-decoder model would make from its
    labels ``target`` (shifted right), where it has none; else ``kwargs`` as they are."""
    kind = type(model)
    if kind not in _DECODES:
        _DECODES[kind] = callable(getattr(model, "prepare_decoder_input_ids_from_labels", None))
    if not _DECODES[kind] or target is None or any(k in kwargs for k in _DECODER_INPUTS):
        return kwargs
    return {**kwargs, "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=target)}


def one_argument(model: Any, keys: Any = ()) -> bool:
    """Whether ``model``'s forward takes exactly one argument, and no others by keyword, and
    that argument is not named as one of ``keys`` (a dict batch's: it takes that one by name)."""
    try:
        parameters = list(inspect.signature(getattr(model, "forward", model)).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(parameters) == 1 and parameters[0].name not in keys and parameters[0].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def call_with_dict(model: nn.Module, batch: Mapping, kwargs: Dict[str, Any], target: Any = None) -> Any:
    """The model's output for a dict ``batch``: ``model(**kwargs)`` (its inputs by name), or
    ``model(batch)`` for a forward of one argument that takes none of them (see the module).
    ``target``: the batch's target (an encoder-decoder's decoder inputs are made from it)."""
    if _WHOLE and (type(model), tuple(batch)) in _WHOLE:      # (none: nothing to build, every step)
        return model(batch)
    kwargs = with_decoder_inputs(model, kwargs, target)
    try:
        return model(**kwargs)
    except TypeError as e:
        if "keyword argument" not in str(e):
            raise
        error = e
    name = type(model).__name__
    fixes = ("rename them, leave the others out in collate_fn (Hugging Face's Trainer drops the columns forward "
             "does not take), or pass forward=fn(model, batch) -> (output, target)")
    if not one_argument(model, batch):
        raise TypeError(f"a dict batch goes to model(**batch) without its target, so its keys must be the "
                        f"arguments of {name}.forward ({error}); {fixes}") from None
    try:
        output = model(batch)
    except Exception as whole:
        raise TypeError(f"a dict batch goes to model(**batch) without its target ({error}), or, to a forward of one "
                        f"argument, whole as model(batch), which failed too ({type(whole).__name__}: {whole}); "
                        f"{fixes}") from whole
    _WHOLE[(type(model), tuple(batch))] = True
    return output
