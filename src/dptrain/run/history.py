"""``History``: the run's rows, one per epoch, also read by figure as Keras's ``History`` is.

``result["history"]`` is a list of rows (``[{"epoch": 1, "train_loss": ..., "test_loss": ...},
...]``). A Keras program reads its history by figure, ``history.history["val_loss"]``, and
plots it; here ``result["history"]["val_loss"]`` gives the same list, by Keras's, Lightning's
or dptrain's name::

    h = result["history"]
    h[-1]["test_acc"]           # a row, as before: the last epoch's
    h["test_loss"]              # [0.61, 0.47, ...], one per epoch
    h["val_loss"], h["loss"]    # Keras's names: test_loss, train_loss
    plt.plot(h["loss"]); plt.plot(h["val_accuracy"])

An epoch without the figure (not evaluated: ``eval_every``) gives ``nan``, so the list keeps
one value per epoch and plots with a gap. A name no row has is a ``KeyError`` naming those
there are. The rows stay plain dicts: the list saves as JSON as before.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, SupportsIndex, Union, overload

from ..callbacks.monitor import peer_figure

#: Keras's names of the training figures (its ``loss`` is the training loss).
TRAINING_NAMES = {"loss": "train_loss", "accuracy": "train_acc", "acc": "train_acc"}


class History(List[Dict[str, Any]]):
    """A list of rows that also gives a figure's values over the epochs: ``history[name]``."""

    @overload
    def __getitem__(self, key: SupportsIndex) -> Dict[str, Any]: ...

    @overload
    def __getitem__(self, key: slice) -> List[Dict[str, Any]]: ...

    @overload
    def __getitem__(self, key: str) -> List[float]: ...

    def __getitem__(self, key: Union[SupportsIndex, slice, str]) -> Any:
        if not isinstance(key, str):
            return super().__getitem__(key)
        name = self.figure(key)
        return [row.get(name, math.nan) for row in self]

    def figure(self, key: str) -> str:
        """Our name of the figure ``key`` names (``val_loss``: ``test_loss``; ``loss``:
        ``train_loss``); a ``KeyError`` if no row has it."""
        names = {k for row in self for k in row}
        for name in (key, peer_figure(key), TRAINING_NAMES.get(key), "train_" + key):
            if name in names:
                return name
        raise KeyError(f"no epoch has a figure {key!r}; the rows have {', '.join(sorted(names)) or 'none'}"
                       + ("" if self else " (no epoch ran)"))

    def figures(self) -> List[str]:
        """The names of the figures the rows have, in the order they first appear (Keras's
        ``history.history.keys()``)."""
        seen: Dict[str, None] = {}
        for row in self:
            seen.update(dict.fromkeys(row))
        return list(seen)
