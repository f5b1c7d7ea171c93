"""``Task``: what to train (model, data, loss, optimizer, schedule, metrics), not how.

How (devices, processes, epochs, checkpoints...) is a ``TrainConfig``. ``dptrain.fit`` takes
a model and data directly; a ``Task`` is the same thing in one object, which is what a
recipe returns: the built-in recipes (``recipes.py``) and yours
(``dptrain train --recipe my_tasks.py:make``) are functions ``(config) -> Task``.

    def make(config):
        return dptrain.Task(model=MyNet(), train_data=train_set, eval_data=test_set,
                            loss=nn.CrossEntropyLoss(), optimizer=torch.optim.AdamW,
                            scheduler=functools.partial(CosineAnnealingLR, T_max=10))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import lightning_config
from .lightning_module import LightningSteps
from .lightning_trainer import LateConfigure
from .loss_names import loss_named
from .metric_names import metrics_named
from .stateful_metrics import is_stateful
from .class_weights import ClassWeights
from .loss_kinds import REDUCTIONS, WEIGHABLE, as_module, scores_accuracy
from .sample_weights import check_weighable
from .updates import check_updates, combined, part_schedulers
from .user_scheduler import LentScheduler, built_on
from ..parallel.optim import OptimizerSpec, check_learning_rate
from ..parallel.given_model import unwrapped
from ..parallel.trainers import check_optimizers

Metric = Callable[[Any, Any], Tuple[Any, Any]]      # (output, target) -> (sum, count)
SCHEDULER_INTERVALS = ("epoch", "batch")
RESERVED_METRICS = ("loss", "acc", "count", "correct")
DEFAULT_EPOCHS = 10         # when neither the task nor the run says (nor max_steps)


def callback_list(callbacks: Any) -> List[Any]:
    """``callbacks`` as a list (copied): a list or tuple, an iterable with no hook of its own, or
    one callback (Lightning's ``Trainer`` takes one too); None: none."""
    if callbacks is None:
        return []
    several = isinstance(callbacks, (list, tuple)) or (
        hasattr(callbacks, "__iter__") and not any(n.startswith("on_") for n in dir(callbacks)))
    return list(callbacks) if several else [callbacks]


@dataclass
class Task:
    """What to train. Only ``model`` and ``train_data`` are required.

    - ``model``: any ``nn.Module`` (lazy layers too); it ends trained, in place.
    - ``train_data``, ``eval_data``: a map-style ``Dataset`` (``TensorDataset``,
      torchvision-style ``(image, label)``, dicts...), tensors ``(X, y)``, a dict of tensors,
      or a function returning one of these (called once, when the run starts).
    - ``loss``: ``loss(output, target)``, any reduction (default ``nn.CrossEntropyLoss()``);
      ``reduction``: ``"mean"`` or ``"sum"`` for a plain function (a module says its own).
    - ``forward(model, batch) -> (output, target)``: how a batch meets the model when it is not
      ``model(x)`` against ``y``. ``step(model, batch) -> loss`` (or ``(sum, count)``): the
      whole loss, for models that compute their own.
    - ``optimizer``: a name (``"sgd"``...) with ``optimizer_params``, a ``torch.optim`` class
      or factory, or an optimizer built on ``model``; ``lr`` overrides every group's. Several
      optimizers on one loss (Muon for matrices, AdamW for the rest): ``{name: optimizer}``
      or a list, each built on its parameters, taken as one ``CombinedOptimizer``.
    - ``scheduler(optimizer) -> LRScheduler``, stepped every ``scheduler_interval``
      (``"epoch"``, the default unless a Lightning config says, or ``"batch"``: every update,
      Lightning's ``"step"``, taken too; with several optimizers: one for each, or a dict of
      them by update name; on one loss, one over all of their groups, or a dict by optimizer
      name). ``scheduler_monitor``: the figure
      a ``ReduceLROnPlateau`` decides on (default: the test loss; ``"test_acc"``, Keras's
      ``"val_accuracy"``...; its ``mode`` must take it the right way). Lightning's
      ``configure_optimizers()`` output as ``optimizer`` (or its ``lr_scheduler_config`` as
      ``scheduler``) gives all three (``lightning_config.py``).
    - ``metrics``: ``{name: fn(output, target) -> (sum, count)}``, evaluated on
      ``eval_data`` and summed over devices and processes (accuracy is added for
      classification losses); or ``{name: metric object}`` (a ``torchmetrics.Metric``:
      macro-F1, AUC, a confusion matrix...), computed over the whole set; ``{name:
      whole_set(fn)}``, a function of every output and target at once (a Hugging Face
      ``compute_metrics`` alone, ``whole_set(compute_metrics)``: ``whole_set.py``); or Keras's
      names, ``["accuracy", "mae"]`` (``metric_names.py``).
    - ``init(module)``: runs once before the model is copied to the devices.
    - ``epochs``, ``batch_size`` (global), ``kvstore``: defaults for ``TrainConfig``
      (``epochs`` None: 10, or with ``max_steps`` as many as its updates need);
      ``per_device``: batch size and lr given per device, scaled by the device count.
    - ``channels_last``: the model takes NHWC images well (convolutions, no ``.view`` of
      them), so dptrain uses that layout where it was measured to pay (CPU devices, amp).
    - ``collate_fn``: how a Dataset's samples make a batch (default: PyTorch's).
    - ``callbacks``: hooks into the run (``dptrain.Callback``), before ``fit``'s own.
    - ``name``, ``dataset``: how results and checkpoints name the run.
    - ``class_weight``: Keras's, ``{class: weight}`` (or one weight a class): each training
      sample's loss times its class's weight, the sum over the samples; evaluation unweighted
      (``class_weights.py``). For cross-entropy, NLL and binary cross-entropy.
    - ``sample_weight``: Keras's, one weight a training sample (an array or list beside
      ``train_data``; ``data/sample_weights.py``), or ``True`` where the training batches carry
      them last, ``(x, y, w)`` (a dict batch: its ``"sample_weight"``): each sample's loss times
      its weight, the sum over the samples (``engine/sample_weights.py``); an evaluation set's
      ``test_loss`` is weighed only by weights of its own (``(x, y, w)``, ``validation_split``'s part).
      For torch's classification and element-wise losses; with ``class_weight``, their product.
    """
    model: nn.Module
    train_data: Any
    eval_data: Any = None
    loss: Union[None, str, Callable] = None
    reduction: Optional[str] = None
    forward: Optional[Callable[[nn.Module, Any], Tuple[Any, Any]]] = None
    step: Union[None, Callable[[nn.Module, Any], Any], Dict[str, Callable[[nn.Module, Any], Any]]] = None
    optimizer: Union[OptimizerSpec, Dict[str, OptimizerSpec]] = "sgd"
    optimizer_params: Optional[Dict[str, Any]] = None
    lr: Optional[float] = None
    scheduler: Union[None, Callable[[Any], Any], Dict[str, Callable[[Any], Any]]] = None
    scheduler_interval: Optional[str] = None     # "epoch" (unless a Lightning config says)
    scheduler_monitor: Optional[str] = None
    metrics: Union[Dict[str, Metric], Sequence[str]] = field(default_factory=dict)
    init: Optional[Callable[[nn.Module], None]] = None
    epochs: Optional[int] = None
    batch_size: int = 256
    kvstore: Optional[str] = "device"
    per_device: bool = False
    channels_last: bool = False
    collate_fn: Optional[Callable] = None
    callbacks: Sequence[Any] = ()
    name: str = "custom"
    dataset: Optional[str] = None
    class_weight: Any = None
    sample_weight: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(self.model).__name__}")
        self.model = unwrapped(self.model)      # a DDP-wrapped model: the module it wraps trains
        if self.train_data is None:
            raise ValueError("train_data is missing: give a Dataset, tensors (X, y), or a dict of tensors")
        if self.step is not None and self.loss is not None:
            raise ValueError("give either loss (with the default or your forward) or step, not both: step "
                             "computes the loss itself")
        if not isinstance(self.optimizer, LateConfigure):       # (else: configure_later, once updates are counted)
            self._take_optimizer()
        if isinstance(self.loss, str):
            self.loss = loss_named(self.loss)
        if self.class_weight is not None:
            if self.step is not None:
                raise ValueError("class_weight weighs fit's loss, and a step function (a LightningModule's "
                                 "training_step) computes its own: weigh the samples there, or give loss= and no step")
            ClassWeights(self.class_weight, as_module(self.loss or nn.CrossEntropyLoss()))     # (checked now)
        if self.sample_weight is False:
            self.sample_weight = None
        if self.sample_weight is not None:
            if self.step is not None:
                raise ValueError("sample_weight weighs fit's loss, and a step function (a LightningModule's "
                                 "training_step) computes its own: weigh the samples there (the batch carries "
                                 "them), or give loss= and no step")
            check_weighable(as_module(self.loss or nn.CrossEntropyLoss()), WEIGHABLE)      # (checked now)
        if isinstance(self.metrics, (list, tuple)) or is_stateful(self.metrics):
            # Keras's metrics=["accuracy", "mae"], metric objects named by their class, or one alone
            # (a Trainer's compute_metrics as whole_set: its keys name the figures)
            many = isinstance(self.metrics, (list, tuple))
            self.metrics = metrics_named(self.metrics if many else [self.metrics], self.loss, self.step)
        for name in ("loss", "forward", "step", "init", "collate_fn"):
            value = getattr(self, name)
            if name == "step" and isinstance(value, dict):
                continue        # (check_updates looked at them)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable, got {type(value).__name__}")
        self.callbacks = callback_list(self.callbacks)       # (each one is checked later)
        if self.reduction is not None and self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}; choose mean or sum")
        if self.lr is not None:
            check_learning_rate(self.lr, "lr")
        if not isinstance(self.metrics, dict) or not all(callable(f) or is_stateful(f) for f in self.metrics.values()):
            raise TypeError("metrics must be a dict {name: fn(output, target) -> (sum, count)}, {name: torchmetrics "
                            "object} or {name: dptrain.whole_set(fn)}, a list of Keras's names and metric objects, "
                            "or one metric object (dptrain.whole_set(compute_metrics))")
        # (no accuracy of dptrain's with a step function or a loss not a classifier's: "acc" is free;
        # several optimizers' each update's loss is not)
        accuracy = self.step is None and scores_accuracy(self.loss)
        reserved = RESERVED_METRICS if accuracy else ("loss", "count", *(f"{u}_loss" for u in self.updates))
        for name in self.metrics:
            if name in reserved or str(name).endswith("_count"):
                own = "test_loss, test_acc" if accuracy else "test_loss, each update's test_<name>_loss" \
                    if self.several else "test_loss"
                raise ValueError(f"metric name {name!r} is taken by dptrain's own figures ({own} and their counts): "
                                 f"call it something else, e.g. {('my_' + str(name))!r}")
        if isinstance(self.step, LightningSteps):       # (the names its validation_step logs join them)
            self.step.metrics = self.metrics
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if value is None and name == "epochs":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")

    def _take_optimizer(self) -> None:
        """The optimizer and its schedule as the run takes them (Lightning's forms unpacked,
        several on one loss combined, a scheduler built on the optimizer lent), checked."""
        if self.manual:         # (a LightningModule stepping its optimizers: each by its place, "0", "1"...)
            if self.lr is not None:
                raise ValueError("lr= with automatic_optimization off: set each optimizer's lr in configure_optimizers")
            if self.scheduler is not None:
                raise ValueError("scheduler= with automatic_optimization off: the module's training_step steps "
                                 "its schedulers (self.lr_schedulers()); build them in configure_optimizers")
            self.optimizer, self.scheduler = lightning_config.manual_optimizers(self.optimizer)
            self.step.manual.schedulers = {name: lent.scheduler for name, lent in self.scheduler.items()}
            self.scheduler_interval = "epoch"       # (held: the module steps them)
            check_optimizers(self.optimizer, self.model)
            return
        self.optimizer, self.scheduler, self.scheduler_interval, self.scheduler_monitor = lightning_config.unpack(
            self.optimizer, self.scheduler, self.scheduler_interval, self.scheduler_monitor)
        if self.scheduler_interval is None:
            self.scheduler_interval = "epoch"
        if isinstance(self.loss, nn.Module) and isinstance(self.optimizer, torch.optim.Optimizer):
            held = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
            if any(id(p) in held for p in self.loss.parameters()):
                raise ValueError("the optimizer holds parameters of the loss: fit trains the model's parameters "
                                 "(a copy on every device, gradients summed); make the loss a submodule of the "
                                 "model (model.criterion = loss) and pass step=lambda model, batch: "
                                 "model.criterion(model(batch[0]), batch[1]) instead of loss=")
        if self.several:
            check_updates(self)
        elif isinstance(self.optimizer, (dict, list, tuple)):       # one loss: stepped as one optimizer
            self.optimizer = combined(self.optimizer, self.model)
        if not self.several:        # (a dict or list of them: one for each of a combined one's parts)
            self.scheduler = part_schedulers(self.scheduler, self.optimizer)
        if built_on(self.scheduler, self.optimizer):        # Accelerate's and Lightning's habit
            if self.lr is not None:
                raise ValueError("lr= with a scheduler built on the optimizer: the scheduler's base learning rates "
                                 "are the optimizer's; set lr on the optimizer (or drop lr=)")
            self.scheduler = LentScheduler(self.scheduler, self.optimizer)
        value = self.scheduler
        if hasattr(value, "optimizer") and not callable(value) and not isinstance(value, dict):
            kind = type(value).__name__
            raise TypeError(f"scheduler must be a function of the optimizer, or one built on the optimizer "
                            f"given to fit, not a {kind} made on another: pass optimizer= the one it was built "
                            f"on, or scheduler=lambda optimizer: {kind}(optimizer, ...), or "
                            f"functools.partial({kind}, ...)")
        if value is not None and not callable(value) and not isinstance(value, dict):   # (a dict: looked at)
            raise TypeError(f"scheduler must be callable, got {type(value).__name__}")
        if self.scheduler_interval == "step":     # (Lightning's name: an update, as ours)
            self.scheduler_interval = "batch"
        if self.scheduler_interval not in SCHEDULER_INTERVALS:
            raise ValueError(f"unknown scheduler_interval {self.scheduler_interval!r}; choose epoch or batch")
        if self.scheduler_monitor is not None and not isinstance(self.scheduler_monitor, str):
            raise TypeError(f"scheduler_monitor must be a figure's name ('test_acc'), got {self.scheduler_monitor!r}")

    @property
    def configured_later(self) -> bool:
        """Whether the optimizer is a LightningModule's ``configure_optimizers``, called once
        the run's updates are counted (it reads ``self.trainer.estimated_stepping_batches``)."""
        return isinstance(self.optimizer, LateConfigure)

    def configure_later(self, count: Callable[[str], float]) -> None:
        """Call it now (``count(name)``: the run's updates or an epoch's batches, counted if it reads
        them) and take what it gives (None: fit's default optimizer)."""
        made = self.optimizer(count)
        self.optimizer = "sgd" if made is None else made
        self._take_optimizer()

    @property
    def manual(self) -> bool:
        """Whether it is a LightningModule whose ``training_step`` steps its optimizers
        (``automatic_optimization`` off: ``manual_optimization.py``)."""
        return isinstance(self.step, LightningSteps) and self.step.manual is not None

    @property
    def several(self) -> bool:
        """Whether it has several optimizers, each with its step (``step`` a dict)."""
        return isinstance(self.step, dict)

    @property
    def updates(self) -> Dict[str, Callable[[nn.Module, Any], Any]]:
        """The steps by update name, in the order they run (``{}`` with one optimizer)."""
        return dict(self.step) if self.several else {}

    def load(self, which: str) -> Any:
        """``train_data`` or ``eval_data``, calling it first if it is a function."""
        data = getattr(self, which)
        return data() if callable(data) and not hasattr(data, "__getitem__") else data
