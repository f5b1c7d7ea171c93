"""What a run is made of, built from its Task and config: the engine and its loaders, the
balancer, and the built-in output callbacks the config asks for."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..callbacks.outputs import EpochLog, MetricsFile, OwnFigures, ProgressBar, TensorBoard, Trace
from ..core.stage import noted, stage
from ..data.accumulate import Accumulating
from ..data.choose_loader import make_loader, own_batch_size, read_as_samples, reading_batch_size
from ..data.sample_weights import weighed, weights_for
from ..data.holdout import data_length, hold_out
from ..data.loader import TensorLoader
from ..data.model_inputs import input_and_target
from ..distributed import DistEnv, get_collective
from ..engine.balance import Balancer
from ..engine.forward_hooks import in_turn_line
from ..engine.lightning_module import LightningSteps
from ..engine.lightning_trainer import BATCHES, UPDATES
from ..engine.model_engine import ModelEngine
from ..engine.sample_weights import split_weights
from ..engine.task import Task
from .agreement import check_agreement, describe_data, describe_settings
from .config import TrainConfig
from .eval_weights import weigh_sets
from .preflight import check_space
from .resume import has_batchnorm
from .step_limit import StepLimit, epochs_for


def builtin_callbacks(config: TrainConfig, env: DistEnv) -> Tuple[List[Any], List[Any]]:
    """The outputs a config asks for, as callbacks (made now: a missing package is said
    before any work): those before the user's callbacks (the bar: its line is cleared before
    a line is printed), and those after (what writes the rows: a figure a callback adds to
    a row in ``on_epoch_end`` is written too)."""
    first: List[Any] = [ProgressBar()] if config.progress and env.rank == 0 else []
    out: List[Any] = [OwnFigures(), EpochLog()]
    if config.metrics_file:
        out.append(MetricsFile(config.metrics_file))
    if config.tensorboard:
        out.append(TensorBoard(config.tensorboard, fresh=config.overwrite, rank=env.rank))
    if config.trace:
        out.append(Trace(config.trace, config.trace_steps, config.trace_from))
    return first, out


def train_mode(model: torch.nn.Module, log: Callable[[str], None]) -> None:
    """A model handed over in eval mode as a whole (``model.eval()`` for a look at it) would
    train without dropout and with frozen BatchNorm statistics, silently: ``fit`` trains it in
    train mode, as Keras and Lightning do, and says so. Modules put in eval mode under a
    training model (a frozen BatchNorm) stay as they are."""
    if not model.training:
        model.train()
        log("dptrain: the model was in eval mode: fit trains it in train mode (dropout on, BatchNorm statistics "
            "updated); to freeze layers, call .eval() on them (or on run.model in a callback's on_fit_start)")


def renormalised_in_forward(model: torch.nn.Module, copies: int, log: Callable[[str], None]) -> None:
    """Say so when an ``nn.Embedding(max_norm=...)`` trains on several devices or processes:
    its forward renormalises, in place, the rows its batch looks up, so each copy renormalises
    only its part's rows and the copies drift apart (DDP's processes alike): a step is no
    longer the plain loop's on the whole batch."""
    names = [name or type(model).__name__ for name, m in model.named_modules()
             if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.max_norm is not None]
    if names and copies > 1:
        log(f"dptrain: {', '.join(names[:3])}: an Embedding with max_norm renormalises in its forward only the rows "
            f"each device's part looks up, so the {copies} copies drift apart (as DDP's do); to keep them equal, "
            f"constrain the whole weight in a callback's on_batch_end instead (max_norm=None), or train on one device")


def torch_sync_batchnorm(model: torch.nn.Module, config: TrainConfig, copies: int,
                         log: Callable[[str], None]) -> TrainConfig:
    """A model holding torch's ``nn.SyncBatchNorm`` (``convert_sync_batchnorm``, as a DDP script
    makes it) asks for statistics over the whole batch. Torch's needs a process group on GPUs
    (on CPU processes it refuses the input; on the devices of one process it syncs nothing), so
    with several copies ``fit`` synchronises the statistics itself (``sync_batchnorm=True``),
    and says so."""
    if config.sync_batchnorm or copies < 2 or not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules()):
        return config
    log("dptrain: the model holds torch's SyncBatchNorm layers: fit synchronises BatchNorm statistics over every "
        "device and process itself (sync_batchnorm=True)")
    return dataclasses.replace(config, sync_batchnorm=True)


def shard_of(task: Task, config: TrainConfig, env: DistEnv, devices: List[torch.device]) -> Dict[str, Any]:
    """How this process's loaders read their data: its part, workers, collation, pinning."""
    return dict(rank=env.rank, world_size=env.world_size, num_workers=config.num_workers,
                worker_timeout=config.worker_timeout, dispatch=config.dispatch_batches,
                collate_fn=task.collate_fn, pin_memory=any(d.type == "cuda" for d in devices),
                lower_priority=len(devices) > 1 and all(d.type == "cpu" for d in devices))


def eval_batch_size(name: str, data: Any, given: Optional[int], batch_size: int, log: Callable[[str], None]) -> int:
    """The global batch an evaluation set is read by: ``--eval-batch-size``, else its
    DataLoader's own (as Lightning and Accelerate read each loader), else the training's."""
    own = own_batch_size(data)
    if given and own and given != own:
        log(f"dptrain: the {'evaluation' if name == 'test' else repr(name)} DataLoader's batch_size={own} is not "
            f"used: --eval-batch-size gives {given}")
    return reading_batch_size(data, given, batch_size)


def training_loader(task: Task, config: TrainConfig, batch_size: int,
                    shard: Dict[str, Any]) -> Tuple[Any, Any, Optional[torch.Tensor]]:
    """This process's training loader (``validation_split``'s part held out), the evaluation
    data, and the weights of a held-out part's samples (``sample_weight`` with
    ``validation_split``: its last rows', as Keras's; else None)."""
    train_data, eval_data = task.load("train_data"), task.load("eval_data")
    weights = weights_for(train_data, task.sample_weight)        # (Keras's sample_weight, checked)
    held_out = None
    if config.validation_split is not None:
        if eval_data is not None:
            raise ValueError("both an evaluation set and validation_split were given: give one (eval_data "
                             "evaluates on that set; validation_split holds out the last part of the "
                             "training data)")
        train_data, eval_data = hold_out(train_data, config.validation_split)
        if isinstance(weights, torch.Tensor):
            held_out = weights[data_length(train_data, "sample_weight"):]
    source = train_data
    train_data, collate_fn = weighed(train_data, weights, shard.get("collate_fn"))
    shard = {**shard, "collate_fn": collate_fn}
    loader = make_loader(train_data, batch_size, shuffle=config.shuffle, seed=config.seed,
                         max_batches=config.max_batches, steps_per_epoch=config.steps_per_epoch,
                         sharded=config.sharded_stream, drop_last=config.drop_last, **shard)
    loader.source = source
    return loader, eval_data, held_out


def planned_counts(task: Task, config: TrainConfig, env: DistEnv, devices: List[torch.device],
                   batch_size: int, epochs: Optional[int]) -> Callable[[str], float]:
    """What a LightningModule's ``configure_optimizers`` reads of the run before it starts: a
    reader of ``trainer_counts``' figures by name, counted once, on the first read, on the
    training loader the run makes, before it is made (and closed)."""
    counts: Dict[str, float] = {}
    data = []

    def count(name: str) -> float:
        if not counts:
            loader, _, _ = training_loader(task, config, batch_size, shard_of(task, config, env, devices))
            counts.update(trainer_counts(loader, config, epochs))
            data.append(type(getattr(loader, "dataset", loader)).__name__)
            if hasattr(loader, "close"):
                loader.close()
        if name == UPDATES and counts[name] == math.inf:
            raise ValueError(f"the model's configure_optimizers reads self.trainer.{UPDATES}, but the training "
                             f"data ({data[0]}) has no length, so the run's updates are not known: give "
                             f"max_steps=N (the run's updates) or steps_per_epoch=N (an epoch's)")
        return counts[name]
    return count


def trainer_counts(loader: Any, config: TrainConfig, epochs: Optional[int]) -> Dict[str, float]:
    """Lightning's ``num_training_batches`` (an epoch's batches) and ``estimated_stepping_batches``
    (the updates a run of ``loader`` makes from its start: epochs x an epoch's batches over
    ``accumulate_grad_batches``, or ``max_steps`` if fewer); inf where an open-ended stream's
    are not known."""
    batches = None if getattr(loader, "open_ended", False) else len(loader)
    updates_each = None if batches is None else -(-batches // config.accumulate_grad_batches)
    epochs = epochs or epochs_for(config.max_steps, updates_each)
    updates = StepLimit(config.max_steps).left(0, 1, epochs, updates_each)[0]
    return {BATCHES: math.inf if batches is None else batches, UPDATES: math.inf if updates is None else updates}


def build_engine(task: Task, config: TrainConfig, env: DistEnv, devices: List[torch.device], batch_size: int,
                 lr: Optional[float], log: Callable[[str], None],
                 epochs: Optional[int] = None) -> Tuple[Optional[str], ModelEngine, Any, Any, Dict[str, Any]]:
    """The kvstore in force, the engine (lazy layers materialised, compiled if asked), the
    train and eval loaders of this process, and the other evaluation sets' loaders by name."""
    total_devices = len(devices) * env.world_size
    if batch_size < total_devices:
        raise ValueError(f"batch size {batch_size} is smaller than the {total_devices} devices: "
                         f"use batch_size={total_devices} or more (--batch-size), or fewer devices (devices=, "
                         f"--devices{', --processes' if env.world_size > 1 else ''})")
    if config.sync_batchnorm and not has_batchnorm(task.model):
        raise ValueError(f"--sync-bn: {task.name}'s model has no BatchNorm layer; drop --sync-bn")
    kvstore = task.kvstore if config.kvstore is None else config.kvstore_kind
    channels_last = config.channels_last if config.channels_last is not None else task.channels_last and (
        all(d.type == "cpu" for d in devices) or config.amp is not None)
    # Before the model is broadcast: a process with another model is named, not a gloo abort.
    collective = get_collective()
    check_agreement(collective, env.rank, describe_settings(task, config, epochs, batch_size, lr))
    with stage("placing the model on its devices"):
        engine = ModelEngine(task, devices, kvstore=kvstore, sync_batchnorm=config.sync_batchnorm, amp=config.amp_dtype,
                             channels_last=channels_last, bucket_cap_mb=config.bucket_cap_mb,
                             compile=config.compile, clip_grad_norm=config.max_norm,
                             clip_grad_value=config.clip_grad_value)
    engine.trainer.norms_by_parameter = config.log_grad_norm == "parameters"
    learning = [n for n, p in task.loss.named_parameters() if p.requires_grad] if isinstance(task.loss, nn.Module) \
        else []
    if learning:        # (a learnable loss: metric learning's ArcFace weights, a multi-task weighting)
        log(f"dptrain: the loss's parameters {', '.join(learning[:3])}{' and more' if len(learning) > 3 else ''} "
            f"require gradients, and fit trains the model's alone: to train them too, make the loss a submodule "
            f"of the model (model.criterion = loss) and pass step=lambda model, batch: model.criterion(model("
            f"batch[0]), batch[1]); a network the loss holds frozen: loss.requires_grad_(False) quiets this line")
    if engine.hooked:
        log(in_turn_line(engine.hooked, len(devices)))
    if config.train_metrics:
        engine.keep_train_figures()
        if not engine.train_figures.keys and not engine.train_figures.objects:
            log("train_metrics: nothing to score on the training batches: no accuracy without a classification "
                "loss, and no (sum, count) metric given (metrics={'name': fn(output, target) -> (sum, count)})")
    shard = shard_of(task, config, env, devices)
    with stage("loading the training data"):
        train_loader, eval_data, held_out_weights = training_loader(task, config, batch_size, shard)
        train_loader.least_part = engine.least_part     # (a process's part too: see ModelEngine.least_part)
        if any(getattr(train_loader, "unread", ())):
            log(f"dptrain: sharded_stream: an epoch is {len(train_loader)} batches of {batch_size}, the parts every "
                f"process's share holds; {sum(train_loader.unread)} samples of the longer shares are not read each "
                f"epoch (left per process: {train_loader.unread})")
        if getattr(train_loader, "sharded", False):
            len(train_loader)           # the shares' epochs need a length: the error names the fix
        if getattr(train_loader, "open_ended", False):
            log(f"dptrain: {type(train_loader.dataset).__name__} has no __len__: an epoch is a pass of it read to "
                f"its end (steps_per_epoch=N counts an epoch in batches; max_steps=N ends the run after N updates)")
        if getattr(train_loader, "stream", False) and not getattr(train_loader, "ordered", False):
            if config.shuffle:
                log(f"dptrain: {type(train_loader.dataset).__name__} is a stream, read in the order it yields: "
                    f"shuffle it in the dataset (its set_epoch(epoch) is called before each pass; shuffle=False "
                    f"quiets this line)")
    with stage("loading the evaluation data"):
        sets = evaluation_sets(eval_data, task.metrics)
        # Keras's weighted validation: validation_data=(x, y, w), validation_split's part's own weights
        collates, weighing = weigh_sets(sets, shard.get("collate_fn"), train_loader, engine, held_out_weights, log)
        sizes = {name: eval_batch_size(name, data, config.eval_batch_size, batch_size, log)
                 for name, data in sets.items()}
        loaders = {name: make_loader(data, sizes[name], max_batches=config.eval_batches, optional_workers=True,
                                     sharded=config.sharded_stream, to_the_end=True,
                                     **{**shard, "collate_fn": collates[name]})
                   for name, data in sets.items()}
        for name in weighing:
            loaders[name].weighs = True     # (its batches carry their weights last: evaluation.py)
        eval_loader = next(iter(loaders.values()), None)
        others = dict(list(loaders.items())[1:])
    check_agreement(collective, env.rank, describe_data(train_loader, eval_loader, others))
    keep_on_device(devices[0], train_loader, *loaders.values())
    if isinstance(task.step, LightningSteps) and task.step.clock is not None:     # (its trainer's; open-ended: inf)
        vars(task.step.clock).update(trainer_counts(train_loader, config, epochs))
        task.step.clock.devices_here = len(devices)
        task.step.clock.lend(task.optimizer, getattr(task.scheduler, "scheduler", None), task.scheduler_interval,
                             task.scheduler_monitor)      # (the module's own, for the trial call; the run's later)
    with stage("trying the model on a training and an evaluation batch, before training"), \
            noted(lambda: read_as_samples(train_loader)):
        eval_example = eval_loader.example() if eval_loader is not None else None
        if getattr(eval_loader, "weighs", False):
            eval_example = split_weights(eval_example)[0]
        lit = task.step if isinstance(task.step, LightningSteps) else None     # (its on_before_batch_transfer)
        loaded = lit.loaded if lit is not None else lambda batch, stage="train": batch
        engine.prepare(loaded(train_loader.example()), lr,
                       loaded(eval_example, lit.eval_stage) if lit is not None else eval_example)
    if engine.loss_line:
        log(engine.loss_line)
    if isinstance(train_loader, TensorLoader) and engine.adapter is not None and task.forward is None \
            and not engine.weighted:        # (each batch a slice of its data: their targets are its target's)
        engine.adapter.count_from(input_and_target(train_loader.data)[1])
    if engine.compile_mode:    # on the shard sizes of an epoch: a full batch, and the last one (if known)
        for first in {0} if getattr(train_loader, "open_ended", False) else {0, len(train_loader) - 1}:
            engine.compile(loaded(next(iter(train_loader.batches(first)))))
        log(f"compiled in {engine.compile_seconds:.1f} sec (--compile {engine.compile_mode})")
    if config.accumulate_grad_batches > 1:      # a step is then a group of batches
        train_loader = Accumulating(train_loader, config.accumulate_grad_batches)
    if env.rank == 0:           # room for a checkpoint: model, optimizer state, a margin
        size = sum(t.numel() * t.element_size() for t in engine.state_dict()["model"].values())
        check_space(config.checkpoint_dir, 3 * size + 2**20)
    return kvstore, engine, train_loader, eval_loader, others


def evaluation_sets(eval_data: Any, metrics: Dict[str, Any]) -> Dict[str, Any]:
    """``eval_data`` as named sets: one (named ``test``), or a dict of several data sets
    (``{"val": (X, y), "ood": ood_set}``: not a dict of tensors, which is one set of dict
    batches); the first set's figures are ``test_*``, each other's ``test_<name>_*``."""
    if eval_data is None:
        return {}
    values = list(eval_data.values()) if isinstance(eval_data, dict) else []
    if not values or any(isinstance(v, (torch.Tensor, np.ndarray)) for v in values):
        return {"test": eval_data}
    for name in eval_data:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"evaluation set names must be identifiers (they name figures: test_<name>_loss), got "
                             f"{name!r}")
    figures = {"loss", "acc", *metrics}
    for name in list(eval_data)[1:]:
        clash = sorted(f"test_{name}_{f}" for f in figures if f"{name}_{f}" in figures)
        if clash:
            raise ValueError(f"the evaluation set {name!r} would make figures the first set has "
                             f"({', '.join(clash)}): rename the set or the metric")
    return dict(eval_data)


def keep_on_device(device: torch.device, *loaders: Any) -> None:
    """On a GPU, tensors held in memory move there once (if they take at most a quarter
    of its free memory): each batch is then gathered on the GPU, with no host copy."""
    if device.type != "cuda":
        return
    free = torch.cuda.mem_get_info(device)[0]
    for loader in loaders:
        if isinstance(loader, TensorLoader) and loader.nbytes <= free // 4:
            loader.to(device)
            free -= loader.nbytes


def build_balancer(config: TrainConfig, collective, devices: List[torch.device], train_loader: Any,
                   rank: int) -> Optional[Balancer]:
    """``--balance``: who computes how much of each batch (None: even parts)."""
    if config.balance == "even":
        return None
    per_rank = [int(t.item()) for t in collective.all_gather(torch.tensor([len(devices)]))]
    # New sizes take effect a few steps on: past what a loader prepared ahead.
    balancer = Balancer(config.balance, per_rank, rank, lag=max(3, 2 * config.num_workers + 2),
                        gpu=any(d.type == "cuda" for d in devices))
    balancer.least_part = train_loader.least_part       # (BatchNorm: no part of one sample)
    train_loader.balancer = balancer
    return balancer


#: Steps the host runs ahead of what it reads back on GPUs (see ``loop.py`` and ``tally.py``).
GPU_RUN_AHEAD = 8


def run_ahead(devices: List[torch.device]) -> int:
    """Steps the host runs ahead of what it has read back (see ``loop.py``): GPU_RUN_AHEAD
    on GPUs, 0 on CPU devices. ``DPTRAIN_RUN_AHEAD=N`` overrides it (the tests run the GPU
    bookkeeping on CPUs)."""
    ahead = os.environ.get("DPTRAIN_RUN_AHEAD", "")
    return int(ahead) if ahead.isdigit() else GPU_RUN_AHEAD * any(d.type == "cuda" for d in devices)
