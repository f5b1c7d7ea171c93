"""A keyword ``fit``, ``evaluate`` or ``predict`` does not take: the error names ours.

Keras's, Lightning's and Accelerate's users bring their keywords (``verbose=0``,
``validation_data=``, ``dataloaders=``); Python's "unexpected keyword argument" says nothing
of what to write instead. Each entry point keeps a table of its peers' names (``fit.py``'s
``PEER_KEYWORDS``, ``EVALUATE_PEERS`` and ``PREDICT_PEERS`` here); a typo names the nearest::

    @keywords_checked(EVALUATE_PEERS)
    def evaluate(model, data, *, loss=None, ...): ...

    evaluate(model, (X, y), verbose=0)
    TypeError: evaluate() got an unexpected keyword argument 'verbose'; dptrain has none: it prints nothing
"""
from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable, Dict, Sequence, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: Peers' names every entry point answers alike (fit's ``PEER_KEYWORDS`` takes them too).
COMMON_PEERS = {"workers": "num_workers", "use_multiprocessing": "num_workers (worker processes load the data)"}

_SHARED = {**COMMON_PEERS,
           "x": "data (the second argument: {name}(model, (x, y)))", "y": "data ({name}(model, (x, y)))",
           "dataloaders": "data (the second argument: a DataLoader, a Dataset or tensors)",
           "datamodule": "data ({name}(model, dm): a LightningDataModule's loaders are taken)",
           "steps": "none: every sample of the data (a DataLoader's sampler, or data[:N], for fewer)",
           "callbacks": "none: a callback's work goes around the call",
           "ckpt_path": "none: dptrain.load_weights(model, path) first", "accelerator": "devices"}

#: Keras's ``evaluate`` and Lightning's ``trainer.test``/``validate`` keywords.
EVALUATE_PEERS = {**_SHARED, "verbose": "none: evaluate prints nothing", "return_dict": "none: the figures are a dict",
                  "validation_data": "data (the second argument)"}
#: Keras's ``predict`` and Lightning's ``trainer.predict`` keywords.
PREDICT_PEERS = {**_SHARED, "verbose": "none: predict prints nothing",
                 "sample_weight": "none: predict's outputs are not weighed (weights weigh a loss: fit's and "
                                  "evaluate's sample_weight=)",
                 "return_predictions": "none: the outputs are returned"}


def unexpected_keyword(name: str, key: str, known: Sequence[str], peers: Dict[str, str]) -> TypeError:
    """The error for ``name()`` given ``key``: a peer's name says ours (or, "none: ...", what to
    do instead), a typo the nearest keyword, else the keywords it takes."""
    if key in peers:
        hint = peers[key].format(name=name)
        hint = f"dptrain has none: {hint[6:]}" if hint.startswith("none: ") else f"dptrain's is {hint}"
        return TypeError(f"{name}() got an unexpected keyword argument {key!r}; {hint}")
    near = difflib.get_close_matches(key, list(known), n=1)
    return TypeError(f"{name}() got an unexpected keyword argument {key!r}"
                     + (f"; did you mean {near[0]!r}?" if near else f"; it takes {', '.join(known)}"))


def keywords_checked(peers: Dict[str, str]) -> Callable[[F], F]:
    """Wrap a function of keyword-only settings so that an unknown keyword is
    ``unexpected_keyword``'s error, and Keras's ``fn(model, x, y)`` says the data is one argument."""
    def wrap(fn: F) -> F:
        parameters = inspect.signature(fn).parameters
        known = [p for p, v in parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
        positional = len(parameters) - len(known)

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if len(args) > positional:
                raise TypeError(f"{fn.__name__}() takes the data as one argument, {fn.__name__}(model, (X, y)) "
                                f"(Keras's {fn.__name__}(x, y)); every setting is a keyword")
            for key in kwargs:
                if key not in parameters:
                    raise unexpected_keyword(fn.__name__, key, known, peers)
            return fn(*args, **kwargs)
        return checked  # type: ignore[return-value]
    return wrap
