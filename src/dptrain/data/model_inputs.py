"""How a batch meets the model by default: ``input_and_target`` (the inputs and the target a
batch holds), ``target_of``, and ``call_inputs`` (the call, with the error for Keras's list of
inputs given to a forward taking them one by one).

    (x, y)            -> model(x) against y
    (x1, x2, ..., y)  -> model(x1, x2, ...) against y
    ({"a": xa, "b": xb}, y) -> model(a=xa, b=xb) against y, where forward names a and b
                         (Keras's fit({"a": xa, "b": xb}, y)); else model({"a": ..., "b": ...})
    {"image": x, "label": y}  -> model(image=x) against y (the key among TARGET_KEYS)
    a batch object of one's own (PyG's Batch) -> model(batch) against batch.y

``forward=fn(model, batch) -> (output, target)`` replaces all of it (``engine/model_engine.py``).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable, Dict, Tuple

import torch

from .batch import Batch
from .batch_objects import own_object

#: Keys a dict batch may hold its target under (exactly one of them).
TARGET_KEYS = ("y", "target", "targets", "label", "labels")


def target_of(batch: Batch) -> Any:
    """The target ``input_and_target`` reads from ``batch``, or None where it holds none (the
    inputs alone of an autoencoder's step function, whose metrics read its output)."""
    try:
        return input_and_target(batch)[1]
    except ValueError:
        return None


def input_and_target(batch: Batch) -> Tuple[Tuple[tuple, dict], Any]:
    """How the default forward reads a batch: ``((args, kwargs), target)``.

    ``(x, y)``: ``model(x)`` against ``y``; ``(x1, x2, ..., y)``: ``model(x1, x2, ...)``;
    a dict: ``model(**others)`` against its target key (one of ``TARGET_KEYS``); a batch object
    of one's own: ``model(batch)`` against its ``y`` (PyG's ``data.y``).
    """
    if type(batch) is tuple and len(batch) == 2:        # (x, y), the usual batch: first
        return ((batch[0],), {}), batch[1]
    if isinstance(batch, Mapping):
        keys = [k for k in TARGET_KEYS if k in batch]
        if len(keys) != 1:
            raise ValueError(f"a dict batch needs exactly one target key among {', '.join(TARGET_KEYS)}, got "
                             f"keys {', '.join(map(str, batch))}: rename it, or pass forward=fn(model, batch) -> "
                             f"(output, target), or step=fn(model, batch) -> loss")
        return ((), {k: v for k, v in batch.items() if k != keys[0]}), batch[keys[0]]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return (tuple(batch[:-1]), {}), batch[-1]
    if own_object(batch):       # (PyG's Batch: model(data) against data.y)
        if isinstance(getattr(batch, "y", None), torch.Tensor):
            return ((batch,), {}), batch.y
        raise ValueError(f"a batch of one {type(batch).__name__} (an object of your own) has no target y: pass "
                         f"forward=lambda model, batch: (model(batch), batch.<its target>), or step=fn(model, batch) "
                         f"-> loss")
    raise ValueError(f"a batch of one {type(batch).__name__} has no target: give (input, target) pairs, or pass "
                     f"step=fn(model, batch) -> loss")


def call_inputs(model: Callable, args: tuple) -> Any:
    """``model(*args)``; one input that is a dict whose keys all name arguments of the
    model's forward, ``({"a": xa, "b": xb}, y)`` (Keras's ``fit({"a": xa, "b": xb}, y)``),
    goes in by name, ``model(a=xa, b=xb)`` (it failed on Python's "missing 1 required
    positional argument"; decided once per model class and keys: a dict lookup a step). An
    input that is a tuple or list of several, ``((x1, x2), y)`` (Keras's ``fit([x1, x2], y)``),
    given to a forward taking them one by one, is a TypeError naming the fix; so are more
    inputs than forward takes, ``(x, y, w)`` (Keras's ``sample_weight``, ``fit``'s
    ``sample_weight=True``: read as ``model(x, y)`` against ``w``, it failed on Python's "takes 2
    positional arguments but 3 were given")."""
    one = args[0] if len(args) == 1 else None
    if type(one) is not torch.Tensor and isinstance(one, Mapping) and _by_name(model, one):    # (the usual x: 40 ns)
        return model(**one)
    try:
        return model(*args)
    except TypeError as e:
        if len(args) >= 2 and "positional argument" in str(e) and "were given" in str(e):
            raise TypeError(f"{type(model).__name__}.forward takes fewer inputs than the batch gives it ({e}): a "
                            f"batch of {len(args) + 1} items, (x1, ..., y), is model(x1, ..., x{len(args)}) against its "
                            f"last. For (x, y, sample_weight) (Keras's sample_weight) give fit sample_weight=True "
                            f"(or the data (x, y) and sample_weight=w, one weight a sample): it weighs the training "
                            f"batches, and an evaluation set is unweighted, given as (x, y)") from e
        if isinstance(one, Mapping) and "dict" in str(e):      # (a dict input that went whole, unnamed)
            raise TypeError(f"{type(model).__name__}.forward failed on the batch's input, a dict of the keys "
                            f"{', '.join(map(repr, one))}, given whole ({e}): its keys name none of forward's "
                            f"arguments ({', '.join(_argument_names(model)) or 'none'}), so it was not given by name "
                            f"(Keras's fit({{'name': X}}, y) is model(name=X) where forward takes name): name the "
                            f"keys after forward's arguments, or give the tensor itself, (X, y)") from e
        if not isinstance(one, (tuple, list)) or len(one) < 2 or "required positional argument" not in str(e):
            raise
        raise TypeError(f"{type(model).__name__}.forward takes its inputs one by one ({e}), but each batch's input is "
                        f"one {type(one).__name__} of {len(one)}: give the data as (x1, x2, ..., y) for model(x1, x2, "
                        f"...) (Keras's fit([x1, x2], y) is fit(model, (x1, x2, y))), or pass forward=lambda model, "
                        f"batch: (model(*batch[0]), batch[1])") from e


def _argument_names(model: Any) -> list:
    """The names ``model``'s forward takes (none where they cannot be read)."""
    try:
        parameters = inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return []
    return [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


#: (model class, a dict input's keys): whether its forward takes them by name.
_BY_NAME: Dict[Tuple[type, Tuple[Any, ...]], bool] = {}


def _by_name(model: Any, inputs: Mapping) -> bool:
    """Whether every key of ``inputs`` names an argument of ``model``'s forward (not a forward
    taking the dict whole under another name: ``def forward(self, batch)``)."""
    key = (type(model), tuple(inputs))
    known = _BY_NAME.get(key)
    if known is None:
        named = set(_argument_names(model))
        known = _BY_NAME[key] = bool(inputs) and all(isinstance(k, str) and k in named for k in inputs)
    return known
