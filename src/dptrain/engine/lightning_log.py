"""What a ``LightningModule``'s steps give ``self.log``: ``validation_step``'s kept as figures of
the evaluation, ``training_step``'s as the epoch's ``train_*`` figures (``TrainFigures``). Each
value is a batch's mean kept with its count, so a figure is the mean over the whole set (or
epoch), as Lightning's epoch-level figures are (exact over every device and process, where
Lightning's need ``sync_dist=True``).

    with Recording(replica, shard) as logged:           # replica.log, replica.log_dict record
        out = replica.validation_step(shard, batch_idx)
    logged.figures                                      # {"acc": (mean, n)}: test_acc in the row

A name is read as the evaluation's figure: ``val_acc`` and ``val/acc`` are ``test_acc``
(Keras's and Lightning's names of the first evaluation set are ``test_*`` here), ``val_loss``
is the test loss (``train_acc``, in ``training_step``, is ``train_acc``). A torchmetrics object
logged (the module's own, which the step updates) is kept in ``objects`` and computed over the
whole set (``StepLogs.computed``). Each number of the evaluation is a ``(sum, count)`` metric
of ``fit`` (``Logged``) that reads what the shard's ``validation_step`` logged from ``Latest``
(the step's output stays what it returned: its ``logits`` feed ``metrics=``).
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from ..data.batch import batch_size as size_of
from .stateful_metrics import StatefulMetrics, is_stateful

#: How Lightning programs begin the names of their validation figures.
PREFIXES = ("val_", "val/", "valid_", "valid/", "validation_", "validation/")
#: ... of their training figures, and of their test figures (``test_step``).
TRAIN_PREFIXES = ("train_", "train/", "training_", "training/")
TEST_PREFIXES = ("test_", "test/")


def figure_name(logged: str, prefixes: Tuple[str, ...] = PREFIXES) -> str:
    """The figure ``self.log(logged, ...)`` in ``validation_step`` gives, without its ``test_``:
    ``val_acc`` -> ``acc``, ``val/top5`` -> ``top5``, ``f1`` -> ``f1`` (in ``training_step``,
    with ``TRAIN_PREFIXES``: ``train_acc`` -> ``acc``, its ``train_`` figure)."""
    for prefix in prefixes:
        if logged.startswith(prefix) and len(logged) > len(prefix):
            logged = logged[len(prefix):]
            break
    return logged.replace("/", "_")


class Recording:
    """While open, ``model.log(name, value, ..., batch_size=None, reduce_fx="mean")`` and
    ``model.log_dict`` record ``(value, n)`` by figure name (the batch's mean and ``n``, the
    ``batch_size`` given, else the shard's samples: ``value * n`` is the figure's sum, taken
    where it is summed), and a torchmetrics object (the module's, which its step updates) in
    ``objects``; another value, or a ``reduce_fx`` other than the mean, is an error naming the
    fix. ``names``: figure names by logged name, kept from call to call (a step's log is a
    few microseconds: the tiny MLP's step is ~400)."""

    def __init__(self, model: nn.Module, batch: Any, where: str = "validation_step",
                 prefixes: Tuple[str, ...] = PREFIXES, names: Optional[Dict[str, str]] = None):
        self.model, self.batch, self.where, self.prefixes = model, batch, where, prefixes
        self.names = {} if names is None else names
        self.samples: Optional[int] = None      # the batch's, once a log needs them
        self.figures: Dict[str, Tuple[torch.Tensor, int]] = {}
        self.objects: Dict[str, Any] = {}       # torchmetrics objects logged, by figure name
        #: Each number's ``(on_step, on_epoch)`` as given (None: not said), by logged name.
        self.options: Dict[str, Tuple[Optional[bool], Optional[bool]]] = {}
        self._had: Dict[str, Any] = {}

    def _figure(self, name: str) -> str:
        figure = self.names.get(name)
        if figure is None:
            figure = self.names[name] = figure_name(name, self.prefixes)
        return figure

    def log(self, name: str, value: Any, *args: Any, batch_size: Any = None, reduce_fx: Any = "mean",
            **kwargs: Any) -> None:
        if reduce_fx != "mean" and reduce_fx is not torch.mean:
            raise ValueError(f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): dptrain keeps the mean over the "
                             f"{'epoch' if self.where == 'training_step' else 'evaluation set'} of what "
                             f"{self.where} logs; log a mean (the default)")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.detach()
        elif isinstance(value, (int, float)):
            value = torch.tensor(float(value))
        elif is_stateful(value):        # a torchmetrics object the module updates: computed over the whole set
            self.objects[self._figure(name)] = value
            return
        else:
            raise ValueError(f"self.log({name!r}, {type(value).__name__}) in {self.where}: dptrain records one "
                             f"number (a batch's mean) or a torchmetrics object; log the batch's mean, or give a "
                             f"metric to fit as metrics={{name: metric}}, with validation_step returning "
                             f"{{'loss': loss, 'logits': logits}}")
        if batch_size is not None:
            n = int(batch_size)
        else:
            if self.samples is None:
                self.samples = size_of(self.batch)
            n = self.samples
        self.figures[self._figure(name)] = (value, n)
        self.options[name] = (kwargs.get("on_step", args[2] if len(args) > 2 else None),     # (Lightning's order:
                              kwargs.get("on_epoch", args[3] if len(args) > 3 else None))    # prog_bar, logger, ...)

    def log_dict(self, dictionary: Dict[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, *args, **kwargs)

    def __enter__(self) -> "Recording":
        for name in ("log", "log_dict"):         # (an instance's attribute comes before its class's method)
            if name in self.model.__dict__:
                self._had[name] = self.model.__dict__[name]
            self.model.__dict__[name] = getattr(self, name)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in ("log", "log_dict"):
            self.model.__dict__.pop(name, None)
        self.model.__dict__.update(self._had)


class Latest:
    """The figures the latest call of a step on this thread logged (each device's thread scores
    its shard right after its step), by name."""

    def __init__(self) -> None:
        self._local = threading.local()

    def set(self, figures: Dict[str, Tuple[torch.Tensor, int]]) -> None:
        self._local.figures = figures

    def get(self) -> Dict[str, Tuple[torch.Tensor, int]]:
        return getattr(self._local, "figures", {})


class Logged:
    """A ``(sum, count)`` metric of ``fit``: the figure ``name`` the ``validation_step`` of the
    shard logged (none where it logged none, or in training)."""

    def __init__(self, name: str, latest: Latest):
        self.name, self.latest = name, latest

    def __call__(self, output: Any, target: Any) -> Tuple[Any, int]:
        mean, n = self.latest.get().get(self.name, _NONE)
        if mean.is_cpu:         # (the product on the host, in float64: no tensor op, ~2 us a figure)
            return mean.item() * n, n
        return mean.reshape(()) * n, n


_NONE = (torch.zeros((), dtype=torch.float64), 0)     # (a figure the shard's step did not log)


class StepLogs:
    """What one step method of the module (``where``: ``validation_step``, ``training_step``)
    gives ``self.log``: the names its first call logs (``names``; None before it), what each
    thread's latest call logged (``latest``), and where each torchmetrics object it logs lives
    in the module (``paths``: each device's copy of the module updates its own)."""

    def __init__(self, where: str, prefixes: Tuple[str, ...]):
        self.where, self.prefixes = where, prefixes
        self.names: Optional[List[str]] = None
        self.latest = Latest()
        self.paths: Dict[str, str] = {}
        self._names: Dict[str, str] = {}        # figure names by logged name
        self._known: Set[str] = set()           # the figures (and objects) the first call logged

    def logged_as(self) -> Dict[str, str]:
        """The figure each name the step logged is (``val_acc``: ``acc``)."""
        return dict(self._names)

    def recording(self, model: nn.Module, batch: Any) -> Recording:
        return Recording(model, batch, self.where, self.prefixes, self._names)

    def keep(self, model: nn.Module, logged: Recording) -> None:
        """A call's figures as this thread's latest; the first call's names, and its objects' paths
        (a name a later call logs first is not recorded: a warning says so, once)."""
        self.latest.set(logged.figures)
        if self.names is not None:
            if not (self._known.issuperset(logged.figures) and self._known.issuperset(logged.objects)):
                self._unknown([*logged.figures, *logged.objects])
            return
        self.names = [n for n in logged.figures if n not in ("loss", "count") and not n.endswith("_count")]
        self._known = {*logged.figures, *logged.objects}
        paths = {id(m): path for path, m in model.named_modules()}
        for name, metric in logged.objects.items():
            if id(metric) not in paths:
                raise ValueError(f"self.log(..., {type(metric).__name__}) for {name!r} logs a metric that is "
                                 f"not an attribute of the module ({self.where}): make it one (self.acc = "
                                 f"Accuracy(...) in __init__), so that each device's copy of the module updates "
                                 f"its own")
            self.paths[name] = paths[id(metric)]

    def _unknown(self, names: List[str]) -> None:
        new = [name for name in names if name not in self._known]
        self._known.update(new)
        logged = {v: k for k, v in self._names.items()}
        warnings.warn(f"{self.where} logged {', '.join(repr(logged.get(n, n)) for n in new)} first after its first "
                      f"call, whose names are the figures kept: not recorded; log every name from the first call "
                      f"(self.log(name, value) each step)", stacklevel=2)

    def reset(self, replicas: Sequence[nn.Module]) -> None:
        """A pass over the set starts: every copy of the logged metric objects is reset."""
        for path in self.paths.values():
            for replica in replicas:
                replica.get_submodule(path).reset()

    def computed(self, replicas: Sequence[nn.Module], devices: Sequence[torch.device], alone: bool) -> Dict[str, Any]:
        """The logged metric objects over the set: each device's copy merged, computed over
        every process (this one alone with ``alone``), as ``metrics=``'s objects are."""
        if not self.paths:
            return {}
        copies = {name: [r.get_submodule(path) for r in replicas] for name, path in self.paths.items()}
        stateful = StatefulMetrics.of_copies(copies, devices)
        stateful.alone = alone
        return stateful.compute()


#: What a hook outside the steps logs is one number: its "batch", of one sample.
ONE = torch.zeros(1)


def hook_logged(module: nn.Module, hook: str, prefixes: Tuple[str, ...], call: Callable[[], Any]) -> Recording:
    """``call()`` (the module's epoch-end ``hook``, and a callback's) with what it logs recorded, a
    torchmetrics object it logs computed: the recording (``figures`` by figure name, ``names``)."""
    with Recording(module, ONE, hook, prefixes) as recording:
        call()
    for name, metric in recording.objects.items():
        recording.figures[name] = (metric.compute().detach().float(), 1)
    return recording


def processes_mean(collective: Any, logged: Dict[str, float]) -> Dict[str, float]:
    """Each figure of ``logged`` (each process's own) as the mean of the processes that have it."""
    each = collective.all_gather_object(logged)
    names = sorted({name for one in each for name in one})
    return {k: sum(one[k] for one in each if k in one) / sum(k in one for one in each) for k in names}
