"""Keras's weighted validation: the evaluation sets whose ``test_loss`` their samples' weights weigh.

Two ways in, as Keras's: an evaluation set given as ``(x_val, y_val, val_sample_weight)`` (one
column more than a training sample's items: ``data/sample_weights.weights_carried``), and
``validation_split`` with ``sample_weight``, whose held-out part keeps its rows' weights. Either
set's batches carry the weights last (``data/sample_weights.weighed``) and its loader is marked
``weighs``: ``engine/evaluation.py`` then weighs its loss, never its accuracy or metrics (Keras
weighs only its ``weighted_metrics``), as ``dptrain.evaluate(..., sample_weight=w)`` does.

>>> collates, weighing = weigh_sets(sets, collate_fn, train_loader, engine, held_out, log)
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..data.sample_weights import weighed, weights_carried
from ..engine.loss_kinds import WEIGHABLE
from ..engine.sample_weights import check_weighable


def weigh_sets(sets: Dict[str, Any], collate_fn: Optional[Callable], train_loader: Any, engine: Any,
               held_out: Optional[torch.Tensor],
               log: Callable[[str], None]) -> Tuple[Dict[str, Optional[Callable]], List[str]]:
    """Make the weighted sets of ``sets`` (in place) carry their weights last; returns each
    set's collate function and the names of those weighed. ``held_out``: the weights of
    ``validation_split``'s part (the set ``test``), or None."""
    weights = carried(sets, train_loader, engine, log)
    if held_out is not None:
        weights["test"] = held_out
        log("dptrain: validation_split's held-out samples keep their sample_weight (as Keras's): test_loss "
            "weighed, accuracy and metrics not")
    collates = {name: collate_fn for name in sets}
    for name, w in weights.items():
        sets[name], collates[name] = weighed(sets[name], w, collate_fn)
    return collates, list(weights)


def carried(sets: Dict[str, Any], train_loader: Any, engine: Any, log: Callable[[str], None]) -> Dict[str, Any]:
    """The weights of the sets given as ``(x_val, y_val, val_sample_weight)``, checked, by name;
    those sets left in ``sets`` without them."""
    if not any(isinstance(data, (tuple, list)) and len(data) > 2 for data in sets.values()):
        return {}
    example = engine.unweighted(train_loader.example())
    items = len(example) if isinstance(example, (tuple, list)) else None
    found = {}
    for name, data in sets.items():
        weights = weights_carried(data, items)
        if weights is None:
            continue
        if engine.adapter is None:
            raise ValueError(f"the evaluation set {name!r} carries sample weights (its third item), which weigh fit's "
                             f"loss, and a step function computes its own: give the set as (x, y), or loss= and no step")
        check_weighable(engine.adapter.loss, WEIGHABLE)
        sets[name], found[name] = data[:-1], weights
    if found:
        which = "the evaluation set" if len(sets) == 1 else f"the evaluation sets {', '.join(found)}:"
        log(f"dptrain: {which} (x, y, w): w weighs the samples (Keras's validation_data=(x, y, sample_weight)): "
            f"test_loss weighed, accuracy and metrics not")
    return found
