"""What a ``LightningModule`` reads from its ``Trainer`` while ``fit`` trains it: a stand-in set
as its ``trainer`` for the run (Lightning's ``self.current_epoch`` and ``self.global_step``
read 0 without one, silently).

    stand_in = TrainerStandIn(max_epochs=10, max_steps=None)
    attach(model, stand_in)          # model.trainer is it; model.current_epoch reads it
    stand_in.at(epoch=2, step=340)   # the loop, before each batch: the epoch (from 0), updates done
    detach(model)                    # after the run: model.trainer is None again

It holds ``current_epoch`` (from 0), ``global_step`` (the updates done before the batch; after
an epoch, all of its), ``max_epochs``, ``max_steps`` (-1 without), ``world_size``,
``global_rank``, ``local_rank``, ``is_global_zero``, ``lightning_module`` (the module),
``accumulate_grad_batches``, ``training``, ``validating``, ``testing`` and ``predicting`` (the stage: which step runs),
``gradient_clip_val`` and ``gradient_clip_algorithm`` (fit's ``clip_grad_norm``, ``"norm"``, or
``clip_grad_value``, ``"value"``; else None: ``lightning_clipping.py``), ``datamodule``
(the one given to fit, else None), ``progress_bar_callback`` None (``self.print`` prints on
rank 0), ``strategy`` (``StrategyStandIn``: ``self.all_gather`` over the processes),
``optimizers`` and ``lr_scheduler_configs`` (the run's: ``self.optimizers()`` and
``self.lr_schedulers()`` read them; ``lend``), ``estimated_stepping_batches``: the updates
of the run (epochs x an epoch's batches over ``accumulate_grad_batches``, or ``max_steps`` if
fewer) and ``num_training_batches`` (an epoch's batches; inf: a stream's, read to its end),
counted when read, once the training data is loaded. ``configure_optimizers`` is called then,
once (``LateConfigure``, resolved by the run: ``Task.configure_later``), so that it may read
them (``OneCycleLR(total_steps=...)``). ``callback_metrics`` (and ``logged_metrics``, the same)
holds what the module logged, by the names it logged, each the latest epoch's figure as a
tensor, as Lightning's (``ModuleHooks`` fills it at the epoch's end: the evaluation's figures
before ``on_validation_epoch_end``, the training's before ``on_train_epoch_end``, and what each
hook logs). ``default_root_dir`` and ``log_dir``: the run's ``checkpoint_dir``, else the
working directory (Lightning's without a logger); ``should_stop`` (set True: the run stops, in
step on every process, as ``run.stop`` stops it); ``logger`` None, or with ``tensorboard=DIR``
the run's TensorBoard as Lightning's ``TensorBoardLogger`` (``lend_logger``: its
``experiment`` the run's ``SummaryWriter``), and ``log_dir`` then DIR.
Anything else of Lightning's ``Trainer`` (its loops, callbacks) is an ``AttributeError`` naming
the fix. Every device's copy of the module shares it (``LightningSteps`` sets it on the copy it
calls: Lightning's ``__getstate__`` leaves a copy's trainer out).
"""
from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from ..distributed.collective import Collective, get_collective
from ..distributed.env import DistEnv

#: What the stand-in counts once the training data is loaded: the run's updates, an epoch's batches.
UPDATES, BATCHES = "estimated_stepping_batches", "num_training_batches"
#: What a module reads to count its steps with devices (dptrain's batch is global), by what it counts.
DEVICE_COUNTS = {"num_devices": "device count", "num_nodes": "machine count", "train_dataloader": "loader"}


class TrainerStandIn:
    """See the module docstring."""

    logger = None
    loggers = ()
    progress_bar_callback = None        # (Lightning's self.print then prints, on rank 0)
    sanity_checking = False
    #: Lightning's ``self.log`` outside the steps (which record it) then warns and does nothing.
    barebones = True

    def __init__(self, max_epochs: int, max_steps: Optional[int], accumulate_grad_batches: int = 1,
                 datamodule: Any = None, root: Optional[str] = None,
                 clipping: Tuple[Optional[float], Optional[float]] = (None, None)):
        env = DistEnv.current()
        norm, value = clipping          # (fit's clip_grad_norm and clip_grad_value; Lightning's takes one)
        self.gradient_clip_val = norm if norm is not None else value
        self.gradient_clip_algorithm = "norm" if norm is not None else "value" if value is not None else None
        self.clip_norm_and_value = norm is not None and value is not None
        self.default_root_dir = self.log_dir = root if root is not None else os.getcwd()
        self.callback_metrics: Dict[str, torch.Tensor] = {}     # the latest epoch's, by logged name
        self.logged_metrics = self.callback_metrics
        self.accumulate_grad_batches, self.datamodule = accumulate_grad_batches, datamodule
        self.current_epoch, self.global_step = 0, 0
        self.max_epochs, self.max_steps = max_epochs, max_steps if max_steps is not None else -1
        self.world_size, self.global_rank, self.local_rank = env.world_size, env.rank, env.local_rank
        self.is_global_zero = env.rank == 0
        self._count: Optional[Callable[[str], float]] = None    # counts UPDATES or BATCHES, when asked
        self.devices_here, self.thread = 1, threading.get_ident()       # (this process's devices; fit's thread)
        self._should_stop, self._stop = False, None     # (lend_stop: the run's stop)
        self.stage: Optional[str] = None

    def at(self, epoch: int, step: int) -> None:
        self.current_epoch, self.global_step = epoch, step

    # Lightning's stage of the run: which of the module's steps runs (``stage``: "train",
    # "validate", "test" or "predict", set by ``LightningSteps`` as it calls them).
    @property
    def training(self) -> bool:
        return self.stage == "train"

    @property
    def validating(self) -> bool:
        return self.stage == "validate"

    @property
    def testing(self) -> bool:
        return self.stage == "test"

    @property
    def predicting(self) -> bool:
        return self.stage == "predict"

    @property
    def should_stop(self) -> bool:
        return self._should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        """Lightning's way for a module to end the run (``self.trainer.should_stop = True``): the
        run's ``stop``, in step on every process (after the batch, whose epoch is evaluated)."""
        self._should_stop = bool(value)
        if self._should_stop and self._stop is not None:
            self._stop()

    def lend_stop(self, stop: Callable[[], None]) -> None:
        """The run's ``stop``, which ``should_stop = True`` calls (at once, if it was set before)."""
        self._stop = stop
        if self._should_stop:
            stop()

    def lend_logger(self, logger: Any) -> None:
        """The run's TensorBoard as Lightning's logger (``BoardLogger``): ``self.logger`` reads it,
        and ``log_dir`` is its directory (Lightning's, with a logger)."""
        self.logger, self.loggers, self.log_dir = logger, [logger], logger.log_dir

    def lend(self, optimizer: Any, scheduler: Any, interval: str, monitor: Optional[str]) -> None:
        """The run's optimizer (several: a dict) and scheduler, which the module's ``self.optimizers()``
        and ``self.lr_schedulers()`` read (Lightning's ``trainer.optimizers``, ``lr_scheduler_configs``);
        before the run makes them (the trial call), those the module's ``configure_optimizers`` gave."""
        self.optimizers = list(optimizer.values()) if isinstance(optimizer, dict) else \
            [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else []     # (a factory: none yet)
        each = [] if scheduler is None else list(getattr(scheduler, "schedulers", {"": scheduler}).values())
        self.lr_scheduler_configs = [SchedulerConfig(s, interval, monitor) for s in each]

    @property
    def strategy(self) -> "StrategyStandIn":
        if "_strategy" not in vars(self):
            self._strategy = StrategyStandIn(self)
        return self._strategy

    def __deepcopy__(self, memo: Any) -> "TrainerStandIn":
        return self                 # (one for every copy of the module)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in (UPDATES, BATCHES):
            if self._count is None:
                raise AttributeError(f"model.trainer.{name} is counted once the training data is loaded: read it "
                                     f"in configure_optimizers (called then) or a training step, not before fit")
            value = self._count(name)
            setattr(self, name, value)
            return value
        if name in ("optimizers", "lr_scheduler_configs"):      # (known, not yet lent: before the run's first step)
            raise AttributeError(f"model.trainer.{name} is the run's, set once it has built its optimizer (before "
                                 f"its first step): read it in a step or a hook, not before fit")
        if name in DEVICE_COUNTS:
            raise AttributeError(f"model.trainer.{name}: fit's batch_size is the global batch (every device's and "
                                 f"process's samples), so counting steps needs no {DEVICE_COUNTS[name]}: an epoch "
                                 f"is self.trainer.{BATCHES} steps, the run self.trainer.{UPDATES} updates; "
                                 f"world_size is the process count")
        raise AttributeError(f"model.trainer.{name}: while fit trains a LightningModule, its trainer is dptrain's "
                             f"stand-in, which holds current_epoch, global_step, max_epochs, max_steps, world_size, "
                             f"global_rank, local_rank, is_global_zero, accumulate_grad_batches, datamodule, "
                             f"strategy (all_gather, reduce, barrier, broadcast), optimizers, lr_scheduler_configs, "
                             f"callback_metrics, should_stop, log_dir, {BATCHES} and {UPDATES}, not {name}: read "
                             f"what you need from the run in a dptrain.Callback (run.epoch, run.step...) and set it "
                             f"on run.model, which every device's copy then has")


@dataclasses.dataclass
class SchedulerConfig:
    """Lightning's ``LRSchedulerConfig``, as ``self.lr_schedulers()`` reads it."""
    scheduler: Any
    interval: str = "epoch"
    monitor: Optional[str] = None
    frequency: int = 1
    name: Optional[str] = None
    strict: bool = True

    @property
    def reduce_on_plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class StrategyStandIn:
    """``self.trainer.strategy``: the collectives over fit's processes that a module's hooks ask of
    Lightning's DDP strategy, as it gives them: ``self.all_gather(x)`` (which calls
    ``all_gather``) each process's ``x`` stacked, ``(world_size, *x.shape)`` (one process: ``x``
    itself), ``reduce`` a sum or mean, ``barrier``, ``broadcast``. Once a process, where fit runs
    (an epoch-end hook); in a step on several devices of a process, each device's thread would
    ask on its own: an error naming the fix. Made on first use (the processes have joined)."""

    def __init__(self, trainer: TrainerStandIn):
        self.trainer = trainer
        self.world_size, self.global_rank, self.is_global_zero = trainer.world_size, trainer.global_rank, \
            trainer.is_global_zero
        self._collective: Optional[Collective] = None

    def _ready(self, what: str) -> Collective:
        if self.trainer.devices_here > 1 and threading.get_ident() != self.trainer.thread:
            raise RuntimeError(f"trainer.strategy.{what} was called in a step on one of the process's "
                               f"{self.trainer.devices_here} devices, each of which would ask on its own: call it "
                               f"in an epoch-end hook (on_validation_epoch_end), which runs once a process, or "
                               f"train on one device a process (devices=1; dptrain launch --processes N)")
        if self._collective is None:
            self._collective = get_collective()
        return self._collective

    @property
    def _lightning_optimizers(self) -> Any:
        """What Lightning's ``self.optimizers()`` reads: the run's optimizers (``lend``)."""
        return self.trainer.optimizers

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        if sync_grads:
            raise ValueError("all_gather(sync_grads=True) (gradients through the gather, a contrastive loss over "
                             "every process's batch) is not done inside a training_step: give fit "
                             "forward=fn(model, batch) -> (output, target) and loss=dptrain.whole_batch(fn), which "
                             "computes fn(output, target) on the whole global batch on every device and process")
        collective = self._ready("all_gather")
        return tensor if collective.world_size == 1 else torch.stack(collective.all_gather(tensor))

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        op = str(reduce_op).lower().rsplit(".", 1)[-1]      # ("sum", "mean", "avg", ReduceOp.SUM)
        if op not in ("sum", "mean", "avg"):
            raise ValueError(f"trainer.strategy.reduce(reduce_op={reduce_op!r}): fit's takes 'sum' or 'mean'")
        collective = self._ready("reduce")
        if not isinstance(tensor, torch.Tensor):
            return tensor
        total = collective.all_reduce(tensor.detach().clone().double())
        return (total if op == "sum" else total / collective.world_size).to(
            tensor.dtype if tensor.is_floating_point() or op == "sum" else torch.get_default_dtype())

    def barrier(self, name: Optional[str] = None) -> None:
        self._ready("barrier").all_gather_object(None)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        collective = self._ready("broadcast")
        return collective.scatter_object([obj] * collective.world_size if collective.rank == src else None, src)


def explain_trainer(e: RuntimeError, method: str, fix: str) -> None:
    """Lightning's "... is not attached to a `Trainer`." raised in ``model.<method>``: add why
    (dptrain makes no Trainer) and ``fix`` to the message; other errors are left as they are."""
    if "attached to a `Trainer`" in str(e) and e.args:
        e.args = (f"{e.args[0]} (dptrain called model.{method}, a LightningModule's, and it reads the Trainer, "
                  f"which dptrain does not make: {fix})",) + e.args[1:]


class LateConfigure:
    """A module's ``configure_optimizers`` as fit's optimizer: called once, when the run has
    loaded its training data, with ``count(name)`` giving ``estimated_stepping_batches`` or
    ``num_training_batches`` if it reads them (counted then, on the loader the run makes)."""

    def __init__(self, configure: Callable[[], Any], stand_in: TrainerStandIn):
        self.configure, self.stand_in = configure, stand_in

    def __call__(self, count: Callable[[str], float]) -> Any:
        self.stand_in._count = count
        try:
            return self.configure()
        except RuntimeError as e:
            explain_trainer(e, "configure_optimizers()", "give fit optimizer= and scheduler= yourself")
            raise
        finally:
            self.stand_in._count = None

    def __repr__(self) -> str:
        return "model.configure_optimizers (called once the training data is loaded)"


def attach(model: nn.Module, stand_in: TrainerStandIn) -> bool:
    """Set ``stand_in`` as the trainer of a LightningModule that has none (its ``_trainer``
    None); whether it was set."""
    if "_trainer" not in vars(model) or model._trainer is not None:
        return False
    model.__dict__["_trainer"] = stand_in
    stand_in.lightning_module = model       # (Lightning's trainer.lightning_module: a callback reads it)
    return True


def detach(model: nn.Module) -> None:
    """The module's trainer is None again, if it was a stand-in."""
    if isinstance(vars(model).get("_trainer"), TrainerStandIn):
        model.__dict__["_trainer"] = None
