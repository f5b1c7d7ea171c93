"""``devices="auto"`` on a CPU: virtual devices only where they pay.

Two virtual CPU devices doubled LeNet's speed (each computes half the batch on its own
core), but for a small model the work of splitting, two threads and the gradient sum is
more than the compute saved: the tiny MLP of issue 22 took 3x longer a step. So without a
GPU, ``auto`` measures: a few real steps of the model on the first batch, on one device and
on the virtual devices, in turns, on copies of the model (the run itself is untouched, the
random state too); the virtual devices are chosen only when their median step is clearly
shorter (``MARGIN``), and one line says what was chosen and why.

The measurement costs at most about ``BUDGET_S`` (issue 22: a run's set-up within 0.5 s of a
plain loop's), or ``FRACTION`` of the run's estimated time if that is more: a first look (two
steps on ``PEEK`` samples) and the first steps on one device say what it would cost, and a
short run of a model too slow for it keeps one device, unmeasured, and says so. (It once ran
everywhere: ResNet-18's 24 steps of the everyday suite then took 6 s of set-up.) The long
runs are measured because no rule read off the model holds: on this 2-core CPU two virtual
devices ran LeNet at batch 1024 1.6x faster than one device in one process and no faster in
another, ResNet-18 at batch 16 0.87x (RESULTS.md, session 12). Several processes, GPUs,
explicit ``devices=``, per-device recipes (whose batch depends on the device count), resumed
runs (which keep the devices their checkpoint's run chose: ``resumed_on``) and runs with
loading workers (see ``wanted``) are not probed.
"""
from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..core.devices import format_device
from ..core.stage import stage
from ..data.batch import map_tensors
from ..data.choose_loader import make_loader
from ..data.sample_weights import weighed, weights_for
from ..engine.device_streams import ReplayError
from ..engine.forward_hooks import TurnsError
from ..engine.lightning_module import LightningSteps
from ..engine.model_engine import ModelEngine
from ..parallel.combined import CombinedOptimizer
from ..parallel.optim import OptimizerPlan
from ..engine.task import Task
from ..outputs.checkpoint import peek_identity
from .config import TrainConfig

WARM_UP, TIMED, BLOCKS = 2, 6, 2        # steps on each side, in blocks
STEPS = 2 * (WARM_UP + TIMED)           # the measurement's steps, both sides
MARGIN = 0.95                # the virtual devices' step must be this fraction of one device's, or less
BUDGET_S = 0.4               # the measurement's steps' seconds, at most about (module docstring)
FRACTION = 0.01              # ... or this fraction of the run's estimated seconds, if more
PEEK = 2                     # samples of the first look's steps


def kvstore(task: Task, config: TrainConfig) -> Optional[str]:
    """The kvstore the run will use (as ``build_engine`` takes it)."""
    return task.kvstore if config.kvstore is None else config.kvstore_kind


def pick(task: Task, config: TrainConfig, devices: List[torch.device], distributed: bool, batch_size: int,
         epochs: Optional[int], log: Callable[[str], None],
         say: Callable[[str], None]) -> Tuple[Task, List[torch.device]]:
    """The task and the devices to train it on: ``devices``, unless measured (``wanted``,
    ``choose``: ``say`` tells the choice at once) or resumed (``resumed_on``: ``log`` says so)."""
    kept = resumed_on(config, task, devices, distributed, batch_size)
    if kept is not None:
        log(f"dptrain: devices auto: resuming on {len(kept)} of the {len(devices)} devices, as the checkpoint's run "
            f"chose; pass devices= to choose")
        return task, kept
    if task.manual and _automatic(config, task, devices, distributed, batch_size):
        say(f"dptrain: devices auto: {format_device(devices[0])}: the module steps its optimizers itself, whose "
            f"copies on {len(devices)} virtual CPU devices would run in turn (one core); pass devices= to choose")
        return task, devices[:1]
    if wanted(config, task, devices, distributed, batch_size):
        with stage("choosing the devices (a few steps on each choice)"):
            return choose(task, config, devices, batch_size, epochs, say)
    return task, devices


def wanted(config: TrainConfig, task: Task, devices: List[torch.device], distributed: bool, batch_size: int) -> bool:
    """Whether to measure (see the module docstring). Not where the settings ask for several
    devices or cannot have them, whose errors stay as they were: ``kvstore=None`` (sums
    nothing), ``--sync-bn`` (BatchNorm across the devices), a batch smaller than the devices.
    Nor with loading workers: the probe would read its batch without them, unbounded by
    ``--worker-timeout``, and the workers' share of the cores is not in its steps (the CNN of
    issue 22 with 2 workers ran 1.13x faster on the virtual devices): they stay. A ``DataLoader``
    given as the data brings its own workers (which ``make_loader`` uses): the same."""
    return not config.resume and _automatic(config, task, devices, distributed, batch_size)


def resumed_on(config: TrainConfig, task: Task, devices: List[torch.device], distributed: bool,
               batch_size: int) -> Optional[List[torch.device]]:
    """A resumed run that would be measured: the devices its checkpoint's run trained on (a
    measurement now may choose the others, and the run would then differ from an unbroken
    one by float rounding); None to keep ``devices``."""
    if not (config.resume and _automatic(config, task, devices, distributed, batch_size)):
        return None
    saved = (peek_identity(config.checkpoint_dir) or {}).get("devices")
    names = [format_device(d) for d in devices]
    if not isinstance(saved, list) or not 0 < len(saved) < len(names) or names[:len(saved)] != saved:
        return None
    return devices[:len(saved)]


def _automatic(config: TrainConfig, task: Task, devices: List[torch.device], distributed: bool,
               batch_size: int) -> bool:
    return (config.devices in (None, "", "auto") and not distributed and not task.per_device
            and len(devices) > 1 and all(d.type == "cpu" for d in devices) and config.balance in (None, "even")
            and kvstore(task, config) is not None and not config.sync_batchnorm and batch_size >= len(devices)
            and not config.num_workers and not getattr(task.train_data, "num_workers", 0))


def choose(task: Task, config: TrainConfig, devices: List[torch.device], batch_size: int, epochs: Optional[int],
           log: Callable[[str], None]) -> Tuple[Task, List[torch.device]]:
    """The devices to train on for ``epochs`` (see the module docstring), and the task with
    its training data loaded (so a data factory runs once)."""
    data = task.load("train_data")
    task = dataclasses.replace(task, train_data=data)
    fed, collate_fn = weighed(data, weights_for(data, task.sample_weight), task.collate_fn)     # (sample_weight)
    loader = make_loader(fed, batch_size, collate_fn=collate_fn, shuffle=False, seed=0)
    loaded = task.step.loaded if isinstance(task.step, LightningSteps) else lambda batch: batch
    batch = loaded(next(iter(loader.batches())))        # (a LightningModule's on_before_batch_transfer)
    whole = _object_in(batch)
    if whole is not None:
        log(f"dptrain: devices auto: {_names(devices[:1])}: a batch holds a {whole} (one object, whose tensors share "
            f"no first axis), which is not cut into parts, one per device: not measured; pass devices= to choose")
        return task, devices[:1]
    n = len(devices)
    most = config.max_steps * config.accumulate_grad_batches if config.max_steps else None    # in batches
    steps = _steps(loader, epochs, config.max_batches, most)
    short = steps is None or STEPS > FRACTION * steps      # the budget is BUDGET_S (else the run's FRACTION)
    rng = torch.get_rng_state()
    engines: Dict[int, ModelEngine] = {}
    slow: Optional[str] = None
    times: Dict[int, List[float]] = {1: [], n: []}
    kept: Optional[str] = None          # why the virtual devices cannot train it as one does
    try:
        engines[1] = _engine(task, config, devices[:1], loaded(loader.example()))
        if short:
            small = _first(fed, collate_fn, batch_size)
            slow = _peek(engines, lambda: _engine(task, config, devices[:1], loaded(loader.example())),
                         small if small is None else loaded(small))
        if slow is None:
            engines[n] = _engine(task, config, devices, loaded(loader.example()))
        for block in range(2 * BLOCKS if slow is None else 0):     # in blocks, as the loop runs them (and alternating)
            k = (1, n)[block % 2] if block // 2 % 2 == 0 else (n, 1)[block % 2]
            with engines[k].runner.coordinating():
                for _ in range((WARM_UP if block < 2 else 0) + TIMED // BLOCKS):
                    times[k].append(_timed(engines[k], batch))
                    if short and k == 1 and len(times[1]) == WARM_UP and (STEPS - WARM_UP) * times[1][-1] > BUDGET_S:
                        slow = f"a step took {times[1][-1] * 1e3:.0f} ms on one device"
                        break
            if slow is not None:
                break
    except ReplayError:         # (checkpointed blocks drawing outside dropout layers: one device replays them)
        kept = (f"the model's checkpointed blocks draw random numbers outside dropout layers, which {n} virtual "
                f"devices cannot replay exactly")
    except TurnsError:          # (forward hooks of the user's with a whole_batch loss: forwards in turn, waiting)
        kept = (f"the model has forward hooks of yours, which {n} virtual devices would run in turn, and a "
                f"whole_batch loss waits for every device inside the forward")
    finally:
        for e in engines.values():
            e.close()
        torch.set_rng_state(rng)
    if kept is not None:
        log(f"dptrain: devices auto: {_names(devices[:1])}: {kept}; pass devices= to choose")
        return task, devices[:1]
    if slow is not None:
        runs = "" if steps is None else f" and {FRACTION:.0%} of this run's {steps} steps"
        log(f"dptrain: devices auto: {_names(devices[:1])}: {slow}, so measuring {n} virtual devices would take over "
            f"{BUDGET_S} s{runs}: not measured; pass devices= to choose")
        return task, devices[:1]
    one, many = (statistics.median(times[k][WARM_UP:]) for k in (1, n))
    pick = devices if many <= MARGIN * one else devices[:1]
    log(f"dptrain: devices auto: {_names(pick)}: a step took {one * 1e3:.2f} ms on one device, {many * 1e3:.2f} ms "
        f"on {n} virtual devices (median of {TIMED}); pass devices= to choose")
    return task, pick


def _steps(loader: Any, epochs: Optional[int], max_batches: Optional[int], most: Optional[int]) -> Optional[int]:
    """The run's steps (batches, ``--max-batches`` of them at most an epoch, ``most`` at most
    in all: ``--max-steps``' batches; ``epochs`` None: as many as those need), if its data
    has a length."""
    try:
        batches = len(loader)
    except TypeError:
        return most
    steps = (batches if not max_batches else min(batches, max_batches)) * epochs if epochs is not None else most
    return min(steps, most) if most else steps


def _first(data: Any, collate_fn: Optional[Callable], batch_size: int) -> Optional[Any]:
    """The first ``PEEK`` samples as a batch, if the batch is larger."""
    if batch_size <= PEEK:
        return None
    return next(iter(make_loader(data, PEEK, collate_fn=collate_fn, shuffle=False, seed=0).batches()))


def _peek(engines: Dict[int, ModelEngine], rebuild: Callable[[], ModelEngine], small: Optional[Any]) -> Optional[str]:
    """Two steps on one device on ``small`` samples: why the measurement would cost over the
    budget (its every step is at least this long), or None. A model that cannot take so few
    samples (a shape fixed to its batch) is measured as usual, on a fresh copy."""
    if small is None:
        return None
    try:
        with engines[1].runner.coordinating():
            took = min(_timed(engines[1], small) for _ in range(2))
    except Exception:       # noqa: BLE001 - the full steps will say what is wrong, if anything
        engines.pop(1).trainer.close()
        engines[1] = rebuild()
        return None
    if STEPS * took > BUDGET_S:
        return f"a step of {PEEK} samples took {took * 1e3:.0f} ms on one device"
    return None


def _timed(engine: ModelEngine, batch: Any) -> float:
    start = time.perf_counter()
    engine.train_batch(batch)
    return time.perf_counter() - start


def _engine(task: Task, config: TrainConfig, devices: List[torch.device], example: Any) -> ModelEngine:
    optimizer: Optional[Any] = task.optimizer
    model = copy.deepcopy(task.model)
    if isinstance(optimizer, CombinedOptimizer):            # each part on its parameters of the copy
        optimizer = CombinedOptimizer({name: on_copy(o, task.model, model) for name, o in optimizer.optimizers.items()})
    elif isinstance(optimizer, torch.optim.Optimizer):      # built on the real model: built again on the copy
        optimizer = on_copy(optimizer, task.model, model)
    elif isinstance(optimizer, dict):                       # several: each on its parameters of the copy
        optimizer = {name: on_copy(opt, task.model, model) for name, opt in optimizer.items()}
    probe = dataclasses.replace(task, model=model, optimizer=optimizer, callbacks=[])
    engine = ModelEngine(probe, devices, kvstore=kvstore(task, config), amp=config.amp_dtype,
                         clip_grad_norm=config.max_norm, clip_grad_value=config.clip_grad_value)
    clock = task.step.clock if isinstance(task.step, LightningSteps) else None
    if clock is not None:       # (a training_step reading self.optimizers(): the probe's, as the run's are later)
        clock.lend(optimizer if engine.trainer is None or engine.trainer.optimizer is None
                   else engine.trainer.optimizer, None, task.scheduler_interval, task.scheduler_monitor)
    engine.prepare(example, task.lr)
    for trainer in getattr(engine.trainer, "trainers", {0: engine.trainer}).values():     # (several: Trainers)
        if trainer is not None and trainer.layout is not None:     # a factory's optimizer's step hooks: they
            trainer.layout.hooks = trainer.optimizer.user_hooks = []    # run on the run's steps only
    return engine


def on_copy(optimizer: torch.optim.Optimizer, model: torch.nn.Module, copied: torch.nn.Module) -> torch.optim.Optimizer:
    """``optimizer`` built again on ``copied``'s parameters (a deep copy of ``model``), with no
    state: its settings and groups, as the run builds it for each device (``OptimizerPlan``:
    a Lookahead on its optimizer, SAM with its base)."""
    params = list(copied.parameters())
    return OptimizerPlan.from_optimizer(optimizer, list(model.parameters())).build(params, range(len(params)))[0]


def _object_in(batch: Any) -> Optional[str]:
    """The class of a batch object of one's own in ``batch`` (``data/batch_objects.py``), if any."""
    found: List[str] = []
    map_tensors(lambda t: t, batch, lambda o: found.append(type(o).__name__) or o)
    return found[0] if found else None


def _names(devices: List[torch.device]) -> str:
    return ", ".join(format_device(d) for d in devices)
