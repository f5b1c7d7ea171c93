"""Which loader for what the user gave: ``make_loader``.

Tensors, a tuple or dict of them, NumPy arrays or a ``TensorDataset`` are gathered in memory
(``TensorLoader``); a map-style ``Dataset``, a list of samples (``samples_listed``) or the
dataset of a ``DataLoader`` goes through ``DatasetLoader`` (workers, seeded reads); an
``IterableDataset`` through ``StreamLoader`` (``BatchedStream`` where a ``DataLoader`` of
``batch_size=None`` says it yields whole batches). A ``DataLoader``'s collate function, workers and
sampler come with its dataset (``samplers.py``).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from .dataset_loader import DatasetLoader, worker_start
from .batched_stream import BatchedStream, IndexedBatches
from .loader import EpochPlan, TensorLoader, no_sparse
from .samplers import picks_of
from .stream_loader import StreamLoader


def samples_listed(data: Any) -> bool:
    """Whether ``data``, a list or tuple, holds samples (as a ``DataLoader`` takes a list), not
    tensors of every sample (``(X, y)``, ``((X1, X2), y)``, ``(X, {"a": A})``): columns are
    arrays only, nested or not, all of the same number of rows, more rows than items; anything
    else (dicts of a sample, ``(x, y)`` pairs, 0-d tensors, rows that differ) is samples."""
    if not isinstance(data, (list, tuple)) or not data or hasattr(data, "_fields"):
        return False
    rows: set = set()

    def columns(x: Any) -> bool:        # (stops at the first leaf that cannot be a column)
        if isinstance(x, (torch.Tensor, np.ndarray)):
            rows.add(x.shape[0] if x.ndim else None)
            return None not in rows and len(rows) == 1
        if isinstance(x, dict):
            return bool(x) and all(columns(v) for v in x.values())
        return isinstance(x, (tuple, list)) and bool(x) and all(columns(v) for v in x)

    for i, item in enumerate(data):     # a long list of samples is told from its first rows' count
        if not columns(item) or i >= next(iter(rows)):
            return True
    return False


def lists_as_columns(data: Any) -> Any:
    """``data`` with a column given as a Python list made a tensor: ``(X, y)`` where ``X`` is an
    array of N rows and ``y`` a list of N numbers (labels appended in a loop, as Keras takes them),
    which was read as a list of two samples and failed in torch's collate ("stack expects each
    tensor to be equal size"). Anything else is returned as it is."""
    if not isinstance(data, (list, tuple)) or len(data) < 2 or hasattr(data, "_fields"):
        return data
    rows = {x.shape[0] for x in data if isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim}
    lists = [i for i, x in enumerate(data) if isinstance(x, list)]
    if len(rows) != 1 or not lists or len(lists) + sum(isinstance(x, (torch.Tensor, np.ndarray)) for x in data) \
            != len(data):
        return data
    n = next(iter(rows))
    columns = list(data)
    for i in lists:
        if len(columns[i]) != n or not all(isinstance(v, (bool, int, float, list, tuple, np.generic))
                                           for v in columns[i]):
            return data
        try:
            columns[i] = torch.tensor(columns[i])      # (torch's dtypes: floats float32, ints int64)
        except (TypeError, ValueError, RuntimeError):
            return data
    return type(data)(columns)


def _structure(x: Any) -> Any:
    """What a batch or sample is made of (containers, keys, tensors' ranks), not its sizes."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x.ndim
    if isinstance(x, dict):
        return ("dict", tuple((k, _structure(v)) for k, v in x.items()))
    if isinstance(x, (tuple, list)):
        return ("seq", tuple(_structure(v) for v in x))
    return type(x)


def check_not_batches(data: Any) -> None:
    """A ``ValueError`` for a list read as columns (``(X, y)``) whose items look like whole batches
    or samples instead: 3 or more, each a tuple, list or dict of the same make (a list of the
    batches a loader gave). Read as columns it fed ``model(x1, ..., x7)`` against the last item."""
    if not isinstance(data, (list, tuple)) or len(data) < 3 or hasattr(data, "_fields") or samples_listed(data):
        return
    first = _structure(data[0])
    if not isinstance(first, tuple) or any(_structure(item) != first for item in data[1:]):
        return
    kind = type(data[0]).__name__
    raise ValueError(f"the data is a {type(data).__name__} of {len(data)} items, each a {kind} of the same make, which "
                     f"would be read as {len(data)} columns of every sample's values (as (X, y) is): if each item is "
                     f"a batch, give DataLoader(items, batch_size=None) (a step per item); if each is a sample, "
                     f"DataLoader(items, batch_size=B) or the list in a Dataset")


def own_batch_size(data: Any) -> Optional[int]:
    """A ``DataLoader``'s ``batch_size`` (what an evaluation reads it by, as Lightning and
    Accelerate read each loader by its own), or None: other data, or a loader whose batch
    sampler or dataset makes the batches."""
    return data.batch_size if isinstance(data, DataLoader) else None      # (None with a batch_sampler)


def reading_batch_size(data: Any, given: Optional[int], default: int = 256) -> int:
    """The global batch an evaluation or ``predict`` reads ``data`` by: ``given``, else its
    ``DataLoader``'s own, else ``default``. A ValueError for a ``given`` that is no count."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise ValueError(f"batch_size must be a whole number >= 1 (the global batch), got {given!r}")
    return given or own_batch_size(data) or default


def read_as_samples(loader: Any) -> Optional[str]:
    """The line saying a stream's items, which look like whole batches, are read as samples (the
    advice of an error in the first steps), or None (``StreamLoader.read_as_samples``)."""
    loader = getattr(loader, "loader", loader)      # (Accumulating's)
    return loader.read_as_samples() if isinstance(loader, StreamLoader) else None


def make_loader(data: Any, batch_size: int, num_workers: int = 0, collate_fn: Optional[Callable] = None,
                pin_memory: bool = False, worker_timeout: float = 0.0, lower_priority: bool = False,
                steps_per_epoch: Optional[int] = None, optional_workers: bool = False, dispatch: bool = False,
                sharded: bool = False, to_the_end: bool = False, drop_last: Optional[bool] = False,
                **plan: Any) -> EpochPlan:
    """The loader for ``data``: tensors, a tuple/dict of tensors, NumPy arrays, a
    ``TensorDataset`` (gathered in memory), a map-style ``Dataset`` or list of samples
    (``samples_listed``), an ``IterableDataset``
    (``StreamLoader``; ``steps_per_epoch``: batches an epoch), or a ``DataLoader`` (its dataset,
    collate function and workers are used, and its sampler or batch sampler if it picks the
    samples or makes the batches: see ``samplers.py``; else the order and batch size are ours).
    ``lower_priority``: the reading workers run below the training threads (``_yield_to_training``);
    ``optional_workers``: tensors ignore ``num_workers`` (an evaluation set beside a Dataset)
    instead of refusing it; ``dispatch``: a stream is read by rank 0 alone, which sends the
    others their parts, or ``sharded``: each process's stream is its share (``dispatch.py``;
    ``to_the_end``: an evaluation's, each share read to its end; other data: each process
    reads its own part anyway). ``drop_last``: drop each epoch's last batch when it is short
    (None: a ``DataLoader``'s ``drop_last``, else keep it)."""
    if callable(getattr(data, "train_dataloader", None)) and not isinstance(data, (Dataset, DataLoader)):
        raise TypeError(f"the data is a {type(data).__name__} (a LightningDataModule), which fit takes as its "
                        f"training data (fit(model, dm)), and evaluate and predict as theirs: as an evaluation set, "
                        f"give one of its loaders (dm.setup('fit'); fit(model, dm, eval_data=dm.val_dataloader()))")
    if isinstance(data, Iterator) and not isinstance(data, (Dataset, DataLoader, torch.Tensor)):
        raise TypeError(f"the data is a {type(data).__name__} (an iterator, as Keras's fit(generator, "
                        f"steps_per_epoch=N) takes), which cannot be read again each epoch, nor apart for the checks: "
                        f"give what makes it, as an IterableDataset whose __iter__ returns it, in a DataLoader of "
                        f"batch_size=None if it yields whole batches: class Batches(IterableDataset): def "
                        f"__iter__(self): return make_batches(); fit(model, DataLoader(Batches(), batch_size=None), "
                        f"steps_per_epoch=N)")
    sampler = batch_sampler = worker_init_fn = None
    listed = batched = False
    worker_options: Dict[str, Any] = {}
    if isinstance(data, DataLoader):
        batched = data.batch_size is None and data.batch_sampler is None    # its dataset yields whole batches
        if not isinstance(data.dataset, IterableDataset):
            sampler, batch_sampler = picks_of(data)
        collate_fn = collate_fn or data.collate_fn
        num_workers = num_workers or data.num_workers
        worker_init_fn = data.worker_init_fn
        worker_options = {k: getattr(data, k) for k in ("prefetch_factor", "multiprocessing_context")
                          if getattr(data, k, None) is not None}
        drop_last = data.drop_last if drop_last is None else drop_last
        data = data.dataset
        listed = isinstance(data, (list, tuple))    # a DataLoader over a list of samples reads them one by one
    else:
        no_sparse(data)         # (SciPy's matrix would be read as a list of samples)
        check_not_batches(data)     # (a list of batches would be read as columns)
        listed = samples_listed(data)
    plan["drop_last"] = bool(drop_last)
    if drop_last and batch_sampler is not None:
        raise ValueError(f"drop_last drops a short last batch of batch_size samples, but the batch sampler "
                         f"{type(batch_sampler).__name__} makes the batches: drop short ones in it, and leave "
                         f"drop_last unset")
    if batched:             # its dataset yields whole batches: each a global batch
        if not isinstance(data, IterableDataset):       # (a map-style one: its items in an epoch's order)
            data = IndexedBatches(data, bool(plan.get("shuffle")), plan.get("seed", 0), sampler)
        return BatchedStream(data, convert=collate_fn, num_workers=num_workers, worker_timeout=worker_timeout,
                             steps_per_epoch=steps_per_epoch, worker_options=worker_options, dispatch=dispatch,
                             worker_init_fn=worker_start(lower_priority, worker_init_fn), sharded=sharded,
                             to_the_end=to_the_end, **plan)
    if isinstance(data, IterableDataset):
        return StreamLoader(data, batch_size, num_workers=num_workers, collate_fn=collate_fn,
                            worker_timeout=worker_timeout, steps_per_epoch=steps_per_epoch,
                            worker_init_fn=worker_start(lower_priority, worker_init_fn),
                            worker_options=worker_options, dispatch=dispatch,
                            sharded=sharded, to_the_end=to_the_end, **plan)
    if sharded and not to_the_end:
        raise ValueError("sharded_stream applies to a training stream (an IterableDataset, each process's its own "
                         "share); a Dataset or tensors are split between the processes by dptrain")
    if steps_per_epoch is not None:
        raise ValueError("steps_per_epoch counts the epochs of a stream (an IterableDataset); an epoch of a Dataset "
                         "or of tensors is one pass over them (max_batches= cuts each short)")
    picked = sampler is not None or batch_sampler is not None
    if picked:
        plan.pop("shuffle", None)           # the sampler's order
    elif isinstance(data, TensorDataset) and collate_fn is None:
        data = tuple(data.tensors) if len(data.tensors) > 1 else data.tensors[0]
    if picked or listed or isinstance(data, Dataset) or (
            hasattr(data, "__getitem__") and hasattr(data, "__len__")
            and not isinstance(data, (torch.Tensor, np.ndarray, tuple, list, dict))):
        return DatasetLoader(data, batch_size, num_workers=num_workers, collate_fn=collate_fn, sampler=sampler,
                             batch_sampler=batch_sampler, pin_memory=pin_memory, worker_timeout=worker_timeout,
                             lower_priority=lower_priority, worker_init_fn=worker_init_fn,
                             worker_options=worker_options, **plan)
    if num_workers and not optional_workers:
        raise ValueError("num_workers applies to a Dataset; tensors in memory are gathered without workers")
    return TensorLoader(data, batch_size, **plan)
