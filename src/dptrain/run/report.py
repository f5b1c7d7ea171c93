"""What a run says: each epoch's history row, its metrics record, and the run's result (what
``--json`` prints and ``fit`` returns). Plain functions of what they are given."""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from ..engine.evaluation import sum_keys
from ..engine.stateful_metrics import COMPUTED, pair_metric_names
from ..engine.train_figures import logged_figures
from ..outputs.progress import seconds
from .history import History

Row = Dict[str, Any]


def epoch_row(epoch: int, sec: float, loss: float, count: float, evals: Dict[str, float],
              metric_names: Sequence[str], split: Optional[List[int]] = None,
              computed: Mapping[str, Any] = MappingProxyType({}), trained: Optional[Dict[str, float]] = None,
              trained_computed: Mapping[str, Any] = MappingProxyType({}), updates: Sequence[str] = ()) -> Row:
    """The history row of an epoch from the sums over every process (``evals``: the
    evaluation's sums, empty without an evaluation set; ``trained``: the training figures'
    sums with ``train_metrics``, ``trained_computed`` its metric objects' values).
    ``updates``: several optimizers' names: each one's ``train_<name>_loss``, and
    ``train_loss`` their sum."""
    row: Row = {"epoch": epoch, "sec": sec, "train_loss": loss / count if count else math.nan}
    if trained:         # (the metrics scored in training: with train_metrics; a training_step's self.log)
        row.update(logged_figures(trained))
        row.update(named_figures("train", trained, [name for name in metric_names if name in trained] +
                                 [f"{name}_loss" for name in updates]))
    if updates:
        row["train_loss"] = sum(row[f"train_{name}_loss"] for name in updates)
    _put_computed(row, "train", trained_computed)
    if split is not None:            # each device's part of a full batch, now (--balance)
        row["split"] = split
    row.update(test_figures(evals, metric_names, computed, updates))
    return row


def test_figures(evals: Dict[str, float], metric_names: Sequence[str],
                 computed: Mapping[str, Any] = MappingProxyType({}), updates: Sequence[str] = ()) -> Row:
    """``test_loss``, ``test_acc`` and ``test_<metric>`` from the evaluation's sums over
    every process (none without them), and the metric objects' values (``computed``);
    ``updates``: several optimizers' names, each one's ``test_<name>_loss`` and ``test_loss``
    their sum (as training's)."""
    row: Row = {}
    if evals:
        row["test_loss"] = evals["loss"] / evals["count"] if evals["count"] else math.nan
        row.update(named_figures("test", evals, list(metric_names) + [f"{name}_loss" for name in updates]))
        if updates:
            row["test_loss"] = sum(row[f"test_{name}_loss"] for name in updates)
    _put_computed(row, "test", computed)        # metric objects, over the whole set
    return row


def _put_computed(row: Row, prefix: str, computed: Mapping[str, Any]) -> None:
    """The metric objects' figures into ``row`` as ``<prefix>_<name>``; a name that is one of
    dptrain's own figures (a ``compute_metrics`` returning ``"loss"``) is an error, not a
    figure replaced."""
    for name, value in computed.items():
        key = f"{prefix}_{name}"
        if key in row:
            raise ValueError(f"a metric gives a figure named {name!r}, which would replace dptrain's own {key}: "
                             f"name it otherwise in what the metric returns (e.g. {('my_' + name)!r})")
        row[key] = value


def named_figures(prefix: str, sums: Dict[str, float], metric_names: Sequence[str]) -> Row:
    """``<prefix>_acc`` (with correct predictions) and ``<prefix>_<metric>``: each sum over
    its count (NaN over none)."""
    row: Row = {}
    if "correct" in sums:
        row[f"{prefix}_acc"] = sums["correct"] / sums["correct_count"] if sums["correct_count"] else math.nan
    for name in metric_names:
        row[f"{prefix}_{name}"] = sums[name] / sums[f"{name}_count"] if sums[f"{name}_count"] else math.nan
    return row


def figures_over(engine: Any, loader: Any, collective: Any, evals: Any = None) -> Dict[str, Any]:
    """The ``test_*`` figures of ``engine``'s model over ``loader``'s batches in every process
    (each process its part; ``evals``: this process's sums, if already made): the sums of
    every process in one ``all_reduce``, divided once."""
    keys = sum_keys(engine)
    evals = engine.evaluate(loader) if evals is None else evals
    zero = torch.zeros((), dtype=torch.float64, device=engine.devices[0])
    totals = collective.all_reduce(torch.stack([evals.get(k, zero) for k in keys])).tolist()
    return test_figures(dict(zip(keys, totals)), pair_metric_names(engine.task.metrics), evals.get(COMPUTED, {}),
                        list(engine.task.updates))


def other_sets(engine: Any, loaders: Mapping[str, Any], collective: Any) -> Row:
    """The other evaluation sets' figures (``eval_data={"val": ..., "ood": ...}``): the first
    set's are ``test_*``, each other's ``test_<name>_*`` (``test_ood_acc``), by the same code,
    so every consumer of ``test_*`` figures (lines, monitors, TensorBoard) takes them too."""
    row: Row = {}
    for name, loader in loaders.items():
        for key, value in figures_over(engine, loader, collective).items():
            row[f"test_{name}_{key[len('test_'):]}"] = value
    return row


def row_of(run: Any, epoch: int, sec: float, trained: List[Any], skipped: int, evals: Dict[str, Any],
           keys: List[str], others: Row) -> Row:
    """Epoch ``epoch``'s row of ``run`` (``loop.py``), the same on every process: this
    process's ``trained`` sums (loss, count, training figures) and evaluation sums ``evals``
    (of ``keys``) summed over the processes in one message, then the rest of what the epoch
    was: the other sets' figures, skipped batches, the learning rate, what a cut trained."""
    device = run.devices[0]
    zero = torch.zeros((), dtype=torch.float64, device=device)
    local = [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in trained] + \
        [evals.get(k, zero) for k in keys]
    sums = run.collective.all_reduce(torch.stack(local)).tolist()
    n = len(trained)
    figures, evaluated = dict(zip(run.figure_keys, sums[2:n])), dict(zip(keys, sums[n:]))
    split = run.balancer.sizes(run.step, run.batch_size) if run.balancer is not None else None
    objects = run.engine.train_figures.computed() if run.engine.train_figures is not None else {}
    row = epoch_row(epoch, sec, sums[0], sums[1], evaluated, pair_metric_names(run.task.metrics), split,
                    evals.get(COMPUTED, {}), figures, objects, list(run.task.updates))
    row.update(others)                      # the other evaluation sets' test_<name>_* figures
    if run.config.on_nan == "skip":         # the loss above covers the batches not skipped
        row["skipped"] = skipped
    if run.scheduler is not None:           # the first group's, as the epoch's last batch had it
        row.update(run.schedule.trained_rates or lr_figures(run.engine.trainer))
    if run.cut is not None or run.batches is None or run.train_loader.global_num_samples is None:
        # What the epoch trained: max_steps or max_time ended it, or an open-ended stream did (or
        # a stream of batches: their samples known as they come).
        b = run.cut.position.batch if run.cut is not None else run.epoch_batches
        row.update(batches=b, samples=run.train_loader.global_samples(b))
    return row


def lr_figures(trainer: Any) -> Row:
    """The learning rate the next update uses (its first group's): ``lr``; with several
    optimizers (``parallel/trainers.py``, or a ``CombinedOptimizer``) each one's, ``lr_<name>``;
    none for an optimizer that finds its own (Adafactor's relative step: ``lr=None``)."""
    several = getattr(trainer, "learning_rates", None)
    rates = {f"lr_{name}": lr for name, lr in several.items()} if several is not None else \
        {"lr": trainer.learning_rate}
    return {k: lr for k, lr in rates.items() if not math.isnan(lr)}


def record(row: Row, recipe: str, devices: List[str], world_size: int, samples_per_epoch: int) -> Dict[str, Any]:
    """An epoch's line in the metrics file and TensorBoard."""
    return {**row, "recipe": recipe, "devices": devices, "world_size": world_size,
            "images_per_sec": row.get("samples", samples_per_epoch) / row["sec"] if row["sec"] else 0.0}


def run_result(history: List[Row], samples_per_epoch: int, **facts: Any) -> Dict[str, Any]:
    """The run's result: ``facts`` (recipe, devices, settings...), the last epoch's figures,
    the speed, and the history."""
    seconds = sum(h["sec"] for h in history)
    samples = sum(h.get("samples", samples_per_epoch) for h in history)    # an epoch max_steps ended: its own
    epochs = samples / samples_per_epoch if samples_per_epoch else len(history)
    return {**facts,
            "train_loss": math.nan,
            **({k: v for k, v in history[-1].items() if k.startswith(("test_", "train_"))} if history else {}),
            "sec_per_epoch": seconds / epochs if epochs else 0.0,
            "images_per_sec": samples / seconds if seconds else 0.0,
            "history": History(history)}        # (a list; history["val_loss"]: a figure over the epochs)


def result_of(run: Any) -> Dict[str, Any]:
    """A finished ``Run``'s result (``loop.py``): its settings, figures and history."""
    config, task, engine = run.config, run.task, run.engine
    optimizer = task.optimizer if isinstance(task.optimizer, str) else engine.trainer.optimizer_name
    return run_result(
        run.history, run.train_loader.global_num_samples,
        recipe=task.name, devices=run.device_names, world_size=run.world_size, epochs=run.epochs,
        batch_size=run.batch_size, lr=run.lr, seed=config.seed, dataset=task.dataset, optimizer=optimizer,
        kvstore="dist" if run.env.distributed else run.kvstore, sync_batchnorm=config.sync_batchnorm, amp=config.amp,
        **({"compile": engine.compile_mode, "compile_sec": engine.compile_seconds} if engine.compile_mode else {}),
        **({"backend": run.backend} if run.backend else {}),
        **({"skipped_batches": run.skipped} if config.on_nan == "skip" else {}),
        **({"step_history": run.step_log.rows} if run.step_log is not None else {}),
        **({"timed_out": run.timed_out} if config.max_time is not None else {}))


def closing_line(result: Dict[str, Any]) -> str:
    """``test acc: 0.822, 7.9 sec/epoch on 2 processes x [cpu:0]``."""
    where = f"[{', '.join(result['devices'])}]"
    if result["world_size"] > 1:
        where = f"{result['world_size']} processes x {where}"
    shown = ("test acc", result["test_acc"]) if "test_acc" in result else \
        ("test loss", result["test_loss"]) if "test_loss" in result else ("train loss", result["train_loss"])
    if shown[1] != shown[1]:        # (a step returning no loss, a manual-optimization module's: its last logged one)
        logged = next(((k, v) for k, v in (result.get("history") or [{}])[-1].items()
                       if k.startswith("train_") and k.endswith("loss") and isinstance(v, float) and v == v), None)
        shown = (logged[0].replace("_", " "), logged[1]) if logged is not None else shown
    weights = f"step {result['restored_step']}" if "restored_step" in result else f"epoch {result.get('restored_epoch')}"
    restored = f" (the weights of {weights}, restored)" if "restored_epoch" in result else ""
    return f"{shown[0]}: {shown[1]:.3f}{restored}, {seconds(result['sec_per_epoch'])} sec/epoch on {where}"
