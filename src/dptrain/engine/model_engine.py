"""A Task's model on the devices of one process: one training step per batch, and evaluation.

Each step splits this process's batch (any structure) over the devices, runs forward and
backward of every shard at once, and lets the ``Trainer`` sum the gradients over devices
and processes and divide them once by the global denominator (``losses.py``), so N devices
and N processes take the step one device takes on the whole global batch.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..core.parts import even_parts
from ..core.modes import evaluating
from ..data.accumulate import MicroBatches
from ..data.batch import Batch, batch_size, split_structure, to_device
from ..data.model_inputs import call_inputs, input_and_target
from ..distributed.env import rank
from ..parallel.replicas import replicate
from ..parallel.sync.base import Extras
from ..parallel.sync.buckets import DEFAULT_BUCKET_MB
from ..parallel.trainer import Trainer
from ..parallel.trainers import Trainers
from . import closure_step as closure
from . import direct_step as direct
from .compiled import check_mode, compile_engine, without_prefix
from .device_streams import RandomDraws
from .dict_inputs import call_with_dict
from .evaluation import Totals, evaluate, try_metrics
from .kept_outputs import outputs_kept
from .lightning_module import LightningSteps
from .loss_scale import LossScale
from .losses import Count, LossAdapter, host_number
from .own_loss import check_own_loss, model_loss
from .sample_weights import split_weights
from .stateful_metrics import StatefulMetrics
from .step_functions import StepFunctions, check_sum
from .step_plan import StepPlan, StepResult
from .summed_step import summed_step
from .task import Task
from .train_figures import TrainFigures, with_logged
from .updates import several_step
from .manual_optimization import manual_step
from . import forward_hooks
from .whole_batch import gatherings

_NO_CHANGE = contextlib.nullcontext()      # shared: a step costs no new object


def default_forward(model: nn.Module, batch: Batch) -> Tuple[Any, Any]:
    """``(x, y)`` -> ``(model(x), y)``; see ``model_inputs.input_and_target`` for the other shapes, and
    ``dict_inputs`` for a dict's."""
    (args, kwargs), target = input_and_target(batch)
    if not kwargs:
        return call_inputs(model, args), target
    return call_with_dict(model, batch, kwargs, target), target


class ModelEngine:
    """Train and evaluate ``task.model`` data-parallel on ``devices``.

    >>> engine = ModelEngine(task, [cpu(0), cpu(1)])
    >>> result = engine.train_batch(batch)     # one step on the whole batch: a StepResult
    >>> totals = engine.evaluate(loader)                # {"loss": ..., "count": ..., ...}
    """

    def __init__(self, task: Task, devices: Sequence[torch.device], kvstore: Optional[str] = "device",
                 sync_batchnorm: bool = False, amp: Optional[torch.dtype] = None, channels_last: bool = False,
                 bucket_cap_mb: float = DEFAULT_BUCKET_MB, compile: Optional[str] = None,
                 clip_grad_norm: Optional[float] = None, training: bool = True,
                 clip_grad_value: Optional[float] = None):
        self.task, self.clip_grad_norm, self.sync_batchnorm = task, clip_grad_norm, sync_batchnorm
        self.clip_grad_value = clip_grad_value
        #: Keras's ``sample_weight``: each training batch carries its samples' weights (``sample_weights.py``)
        self.weighted = task.sample_weight is not None
        self.adapter = LossAdapter(task.loss, task.reduction, task.class_weight, self.weighted) \
            if task.step is None else None
        # A step function's forms (steps of several optimizers too), read as the engine needs them
        self.steps = StepFunctions(None if task.several else task.step, task.reduction)
        self.forward = task.forward or default_forward
        self.memory_format = torch.channels_last if channels_last else None
        model = task.model
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.replicas = replicate(model, devices, init=task.init, sync_batchnorm=sync_batchnorm)
        self.devices = self.replicas.devices
        self.stateful = StatefulMetrics(task.metrics, self.devices)     # torchmetrics objects, per device
        # Evaluation alone (dptrain.evaluate) needs no optimizer, gradient sync or broadcast.
        self.trainer: Any = None
        if training and task.several:       # one Trainer per optimizer, taking turns (updates.py)
            if task.optimizer is None:
                raise TypeError("optimizer is None: training a dict of steps takes optimizer={name: an optimizer "
                                "built on the parameters that step trains}")
            self.trainer = Trainers(self.replicas, task.optimizer, kvstore=kvstore, bucket_cap_mb=bucket_cap_mb)
        elif training and task.manual:      # a LightningModule stepping its own: every device updates all
            self.trainer = Trainers(self.replicas, task.optimizer, kvstore="local", bucket_cap_mb=bucket_cap_mb)
            task.step.manual.trainers = self.trainer
        elif training:
            self.trainer = Trainer(self.replicas, task.optimizer, task.optimizer_params, kvstore=kvstore,
                                   bucket_cap_mb=bucket_cap_mb, closure=True)
        self.closure_group = None       # an optimizer needing a closure: its exchange (closure_step.py)
        self.amp = amp
        # float16: the loss scaled before backward, so that small gradients do not vanish
        self.loss_scale = LossScale() if amp == torch.float16 and training else None
        self.loss_factor: Optional[float] = None      # this step's (loss_scale.factor), with fp16
        self.runner = self.replicas.runner
        self.compile_mode = check_mode(compile)
        if self.compile_mode and sync_batchnorm:
            raise ValueError("--compile and --sync-bn do not go together: the synchronised BatchNorm waits for "
                             "every device inside the graph; drop one of them")
        self._nets: Optional[List[nn.Module]] = None
        self.compile_seconds = 0.0
        self.direct = True          # one device of one process: the plain loop's step (direct_step.py)
        #: The fewest samples a device's part of a training batch holds, or none: 2 with BatchNorm
        #: layers (training on one sample is their error; the plain loop's batch had more). Not
        #: synchronised ones: their statistics are the whole batch's, and every part must come.
        self.least_part = 2 if not sync_batchnorm and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in task.model.modules()) else 1
        self.train_figures: Optional[TrainFigures] = None     # train_metrics=True: see keep_train_figures
        self.loss_line: Optional[str] = None        # what prepare found of the model's own loss, to say
        if task.several:
            self.train_figures = TrainFigures(self, score=False)       # each update's loss
        # A whole_batch loss: the devices' (and processes') parts exchanged in each step's loss,
        # and in evaluation the process's devices' (whole_batch.py).
        self.gathering = self.evaluation_gathering = None
        if self.adapter is not None:        # (a loss of the task's: not several optimizers' Trainers)
            world = self.trainer.world_size if self.trainer is not None else 1
            self.adapter.parts = len(self.devices) * world         # (a loss coupling samples: its check)
            self.gathering, self.evaluation_gathering = gatherings(self.adapter, self.devices, world, training)
        # Dropout on several CPU devices: each device's stream, or the forwards in turn (not
        # where the forwards wait for each other: synchronised BatchNorm, a whole_batch loss).
        self.random = RandomDraws(self.devices, training, sync_batchnorm or self.gathering is not None, rank())
        #: Forward hooks of the user's on several devices: the forwards in turn too (forward_hooks.py).
        self.hooked: List[str] = []
        forward_hooks.look(self)
        #: A step function taken as a mean, on several parts: whether it returns a sum is asked once
        #: (step_functions.check_sum; a LightningModule's training_step is its own, a mean).
        self.sum_unchecked = self.trainer is not None and task.reduction is None and not task.several and \
            task.step is not None and not isinstance(task.step, LightningSteps) and \
            len(self.devices) * self.trainer.world_size > 1

    def close(self) -> None:
        """Give the model back as it was: no hook or wrapper of ours left on it."""
        self.random.close()
        self.replicas.close()           # its own BatchNorm layers, with sync_batchnorm
        if self.trainer is not None:
            self.trainer.close()        # last: it gives the user's optimizer object its state back

    def train_on_model_loss(self) -> None:
        """Train on the loss the model computes from the batch's labels, as the step
        ``model(**batch)`` (``own_loss.py``), in place of the loss the task did not give."""
        if self.weighted:
            raise ValueError("sample_weight weighs fit's loss, and the model computes its own from the batch's labels "
                             "(no loss given): give loss= (nn.CrossEntropyLoss(), 'mse'...) to weigh it")
        self.adapter = self.gathering = self.evaluation_gathering = None
        self.steps = StepFunctions(model_loss, self.task.reduction)

    def keep_train_figures(self) -> None:
        """Score every training shard from now on (``train_metrics=True``): accuracy and the
        ``(sum, count)`` metrics of the batches trained (``train_figures.py``)."""
        self.train_figures = TrainFigures(self)

    def _net(self, i: int) -> nn.Module:
        """Replica ``i``, through its ``torch.compile`` wrapper with ``--compile``."""
        return self._nets[i] if self._nets is not None else self.replicas[i]

    def compile(self, example: Batch) -> None:
        """With ``--compile``: compile every replica on ``example`` (a batch of this process,
        with the sizes of an epoch's shards), before training; see ``compiled.py``."""
        if self.compile_mode:
            self.compile_seconds += compile_engine(self, example)

    @property
    def classification(self) -> bool:
        return self.adapter is not None and self.adapter.classification

    def prepare(self, example: Batch, lr: Optional[float] = None, eval_example: Optional[Batch] = None) -> None:
        """Materialise lazy layers with a one-sample batch, then set the learning rate. With
        ``eval_example``: its loss too, in eval mode (an evaluation set that does not fit the
        model fails now, not after an epoch of training)."""
        def run(net: nn.Module, batch: Batch) -> None:
            for step in self.task.updates.values() or [None]:
                self._loss(net, to_device(batch, self.devices[0], self.memory_format), self.devices[0], step=step,
                           weighted=batch is not eval_example)
        steps = self.task.step if isinstance(self.task.step, LightningSteps) else None
        with outputs_kept(self.task.model, steps is not None and steps.ends_epoch):     # (these calls keep nothing)
            # (a causal LM's labels shifted from now on; labels ours cannot take: its own loss)
            self.loss_line = check_own_loss(self, self.unweighted(example))
            self.replicas.initialize(example, run)
            if eval_example is not None:
                with evaluating(self.replicas[0]), torch.no_grad(), \
                        (steps.sanity_check() if steps is not None else contextlib.nullcontext()):
                    run(self.replicas[0], eval_example)
                try_metrics(self, eval_example)
            if steps is not None and self.trainer is not None:      # (no evaluation set, no lazy layer: now)
                with evaluating(self.replicas[0]):
                    steps.name_logs(self.replicas[0], to_device(example, self.devices[0], self.memory_format))
        if self.trainer is None:
            return
        self.train_figures = with_logged(self, self.train_figures)     # a LightningModule's training_step's
        if lr is not None:
            self.trainer.set_learning_rate(lr)
        else:
            self.trainer.learning_rate      # builds the optimizers now: their lrs are checked here

    # -- training ----------------------------------------------------------------------
    def _autocast(self, device: torch.device):
        if self.amp is None:
            return _NO_CHANGE
        return torch.autocast(device.type, dtype=self.amp)

    def unweighted(self, batch: Batch) -> Batch:
        """A training batch without its samples' weights (Keras's ``sample_weight``), as the
        forward reads it."""
        return split_weights(batch)[0] if self.weighted else batch

    def _loss(self, net: nn.Module, shard: Batch, device: torch.device, count: bool = True,
              scored: Optional[int] = None, step: Optional[Callable] = None,
              weighted: bool = True) -> Tuple[torch.Tensor, Count]:
        """The shard's loss as a sum, and its denominator (None: a sum, nothing to divide;
        not computed unless ``count``). ``scored``: the device index under which the
        training figures (``train_metrics``) count this shard, if they are kept. ``step``:
        the step function (several optimizers: the update's; default the task's).
        ``weighted``: a training shard, carrying its samples' weights with ``sample_weight``."""
        figures = self.train_figures if scored is not None else None
        if self.adapter is not None:
            weights = None
            if self.weighted and weighted:
                shard, weights = split_weights(shard)
            with self._autocast(device):
                output, target = self.forward(net, shard)
                value, denominator = self.adapter.measure(output, target, shard, count, weights)
            if figures is not None:
                figures.add(scored, output, target)
            return value, denominator
        value, denominator, output = self.steps.sum_loss(net, shard, self._autocast(device), step)
        if figures is not None:
            figures.add_step_output(scored, net, shard, output)
        return value, denominator

    def _known_count(self, batch: Batch, step: Optional[Callable] = None) -> Tuple[bool, Count]:
        """This process's denominator before any forward, when the batch alone tells it
        (``step``: an update's step function, several optimizers; default the task's)."""
        if self.adapter is None:
            return self.steps.known_count(batch, step)
        if self.task.forward is not None or self.adapter.pairs is not False:
            return False, None          # the forward or the loss tells it
        _, target = input_and_target(self.unweighted(batch))
        return True, host_number(self.adapter.count(target))

    def train_batch(self, batch: Batch, skip_nonfinite: bool = False, extras: Extras = None,
                    sizes: Optional[Sequence[int]] = None, timed: bool = False,
                    global_size: Optional[int] = None) -> StepResult:
        """One step on this process's ``batch``; returns what it did (``StepResult``).

        ``skip_nonfinite``: if a gradient is NaN or infinite on any device of any process, the
        model is left as it was. ``extras``: numbers to sum over the processes with the
        gradients (their sum over processes comes back as ``flags``). ``sizes``: each device's
        part of the batch (``--balance``; default: as equal as can be; a list of them for a group
        of micro-batches, one each). ``timed``: measure each (the last micro-batch's)
        device's forward and backward seconds (on a GPU it then waits). A ``MicroBatches``
        group (``data/accumulate.py``) is one step: forward and backward of each micro-batch
        in turn, the gradients summed locally, then one exchange and one update over them all.
        ``global_size``: the step's samples over every process (float16's loss scaling; default:
        this process's times the processes).
        """
        if self.loss_scale is not None:
            micro = batch if isinstance(batch, MicroBatches) else [batch]
            n = global_size or self.trainer.world_size * sum(batch_size(m) for m in micro)
            # (what the loss's mean counts per sample, from the target before the forward)
            known = micro and self.adapter is not None and self.task.forward is None
            self.loss_factor = self.loss_scale.factor(n, self.adapter.per_sample(
                input_and_target(self.unweighted(micro[0]))[1])
                                                      if known else 1.0)
        if self.sum_unchecked:
            self.sum_unchecked = not check_sum(self, batch)
        result = self._train_batch(batch, skip_nonfinite, extras, sizes, timed)
        if self.train_figures is not None:
            self.train_figures.end_step(result.counted)
        return result

    def _train_batch(self, batch: Batch, skip_nonfinite: bool, extras: Extras, sizes: Optional[Sequence[int]],
                     timed: bool) -> StepResult:
        if self.task.several:
            return several_step(self, batch, skip_nonfinite, extras, timed, sizes)
        if self.task.manual:            # (a LightningModule's training_step steps its optimizers)
            return manual_step(self, batch, skip_nonfinite, sizes, timed)
        if closure.applies(self):       # (LBFGS: the loss evaluated several times a step)
            return closure.closure_step(self, batch, skip_nonfinite, sizes, timed)
        if direct.applies(self, batch, sizes, timed):
            return direct.direct_step(self, batch, skip_nonfinite, extras)
        return summed_step(self, batch, skip_nonfinite, extras, sizes, timed)

    def _plan(self, batch: Batch, sizes: Optional[Sequence[int]], step: Optional[Callable] = None) -> StepPlan:
        """``batch``'s shards and their work; ``step``: an update's step function (several
        optimizers; default the task's)."""
        if self.random.wanted:
            self.random.start(self.replicas)
        n = batch_size(batch)
        # With several processes this is the process's part of the global batch: it may have
        # fewer samples than devices, or none; devices without samples contribute zeros.
        if sizes is None:       # (no device gets one sample where BatchNorm would refuse it: least_part)
            sizes = [n] if len(self.devices) == 1 else even_parts(n, len(self.devices), self.least_part)
        if sum(sizes) != n or len(sizes) != len(self.devices):
            raise ValueError(f"the parts {list(sizes)} do not cut a batch of {n} samples over {len(self.devices)} "
                             f"devices")
        used = [s for s in sizes if s]
        parts = split_structure(batch, used) if len(used) > 1 else [batch] * len(used)
        shards: List[Optional[Batch]] = [parts.pop(0) if s else None for s in sizes]
        # Counted as the other processes count (with the gradients, or after the forward): a process
        # without samples sends what they send (its count 0; none for a sum).
        known, denominator = self._known_count(batch, step)
        plan = StepPlan(self, shards, n, known, denominator, step)
        if not n and not known and (self.adapter.counts_numbers() if self.adapter is not None
                                    else self.steps.counts_numbers(step)):
            plan.counts = [0] * len(self.devices)
        return plan

    def abort_exchanges(self) -> None:
        """A device failed mid-step: the devices waiting for it in an exchange (a whole_batch
        loss's, synchronised BatchNorm's) stop at once, and its error is the one raised."""
        for group in (self.gathering and self.gathering.group, self.replicas.sync_group):
            if group is not None:
                group.abort()

    def _idle(self, i: int) -> torch.Tensor:
        for p in self.replicas[i].parameters():
            if p.requires_grad and p.grad is None:      # a gradient summed so far is kept
                p.grad = torch.zeros_like(p)
        return torch.zeros((), device=self.devices[i])

    def evaluate(self, batches) -> Totals:
        """Sum the loss, its denominator, correct predictions and every metric over
        ``batches`` on every device (see ``evaluation.evaluate``)."""
        return evaluate(self, batches)

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"model": self.replicas[0].state_dict(), "trainer": self.trainer.state_dict()}
        if self.loss_scale is not None:
            state["loss_scale"] = self.loss_scale.state_dict()
        if self.task.manual:            # (a LightningModule's global_step: its optimizers' steps)
            state["manual_steps"] = self.task.step.manual.steps_done
        return state

    def load_state_dict(self, state: dict) -> None:
        self.load_weights(state["model"], "the checkpoint's model")
        self.trainer.load_state_dict(state["trainer"])
        if self.loss_scale is not None and "loss_scale" in state:
            self.loss_scale.load_state_dict(state["loss_scale"])
        if self.task.manual:
            self.task.step.manual.steps_done = state.get("manual_steps", 0)

    def load_weights(self, weights: dict, what: str = "the weights") -> None:
        """Copy a model ``state_dict`` into the model on every device, in place (the
        optimizer keeps its parameters, the step its buffers)."""
        try:
            weights = without_prefix(weights)
            for m in self.replicas:
                m.load_state_dict(weights)
        except (KeyError, RuntimeError) as e:
            raise ValueError(f"{what} cannot be loaded into this model: {str(e).splitlines()[0]}") from None
