"""What a run saves, and how a run resumes from it.

A checkpoint holds the run's identity (task, dataset, global batch, seed: what a resumed run
must share), the model, optimizer and scheduler state, the ``Position`` reached (epoch,
batch, every process's partial loss sums), the history, every process's random state, the
``--balance`` sizes in force and the callbacks' states. A resumed run checks the identity,
takes the rest, and says in one line each setting it changes (learning rate, kvstore,
devices, processes), honouring the change.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from ..core.errors import CheckpointError
from ..engine.compiled import without_prefix
from ..outputs.checkpoint import FILENAME, checkpoint_path, load_checkpoint, save_checkpoint
from .agreement import around_difference

#: What a resumed run must share with the checkpoint's: the task and the global batches.
SAME = ("recipe", "dataset", "batch_size", "seed")
TRAINED = ("model", "loss", "training data", "shuffle")      # see run/agreement.py


@dataclass
class Position:
    """Where a run is: ``epoch`` (from 1), ``batch`` (batches done in it), this process's
    loss sum and denominator so far, the epoch's seconds and batches skipped so far, and
    its training figures' sums so far (``train_metrics``: ``TrainFigures.keys``' order)."""
    epoch: int = 1
    batch: int = 0
    loss_sum: float = 0.0
    count: float = 0.0
    seconds: float = 0.0
    skipped: int = 0
    figures: List[float] = field(default_factory=list)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def rng_states(collective, devices: List[torch.device]) -> List[torch.Tensor]:
    """Every process's random state (CPU, and its GPUs'), for dropout and the like."""
    state = torch.get_rng_state()
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        state = torch.cat([state] + [torch.cuda.get_rng_state(d) for d in cuda])
    return [s.cpu() for s in collective.all_gather(state)]


def own_random_streams(seed: int, rank: int, devices: List[torch.device]) -> None:
    """Give this process (rank > 0) random streams of its own, from ``(seed, rank, device)``:
    dropout then draws other masks on every rank, as on one device over the whole batch,
    and the streams are saved with the checkpoint, so a resumed run draws the same. Rank 0
    keeps the stream it has (a one-process run is unchanged)."""
    if rank == 0:
        return
    torch.manual_seed((seed * 1_000_003 + rank * 7_919) % 2**63)
    for d in devices:
        if d.type == "cuda":
            torch.cuda.manual_seed(((seed * 1_000_003 + rank * 7_919) * 31 + (d.index or 0)) % 2**63)


def random_states(run: Any) -> Dict[str, Any]:
    """Every process's random states: its generators' (``rng``) and its virtual CPU devices'
    streams for dropout (``streams``, ``engine/device_streams.py``; a list per process)."""
    streams = run.engine.random.state()
    return {"rng": rng_states(run.collective, run.devices),
            "streams": run.collective.all_gather_object(streams) if run.world_size > 1 else [streams]}


def set_rng_state(states: List[torch.Tensor], rank: int, devices: List[torch.device]) -> None:
    state = states[rank] if rank < len(states) else states[0]
    cpu = torch.get_rng_state()
    torch.set_rng_state(state[:cpu.numel()])
    rest = state[cpu.numel():]
    for d in (d for d in devices if d.type == "cuda"):
        n = torch.cuda.get_rng_state(d).numel()
        if rest.numel() >= n:
            torch.cuda.set_rng_state(rest[:n], d)
            rest = rest[n:]


def save(run: Any, position: Position, partial: List[List[float]], cut: Any = None,
         metric_states: Any = None) -> None:
    """Rank 0 writes ``run``'s state at ``position``; ``partial`` holds every process's
    ``[loss sum, denominator, *training figure sums]`` so far. Every process calls it (they
    send their random states). ``cut``: ``max_steps`` or ``max_time`` ended the epoch (``step_limit.Cut``):
    its random states, and the callbacks' states of that moment beside the current ones."""
    directory = run.config.checkpoint_dir
    if not directory:
        return
    random = random_states(run) if cut is None else cut.random
    window = run.step_log.state_dict() if run.step_log is not None else None     # (every process)
    if run.rank == 0:
        save_checkpoint(directory, {
            "identity": json.dumps(run.identity()), "epoch": position.epoch, "batch": position.batch,
            "steps": run.step,      # (the updates made: an open-ended stream's epochs have no one length)
            "partial": partial, "seconds": position.seconds, "skipped": run.skipped,
            "epoch_skipped": position.skipped, "history": json.dumps(run.history),
            **({"step_history": json.dumps(run.step_log.rows), "step_window": window} if window else {}),
            "engine": run.engine.state_dict(),
            "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
            "balance": run.balancer.state_dict() if run.balancer is not None else None,
            "callbacks": run.callbacks.state_dict(), **random,
            **({"callbacks_at_cut": cut.callbacks, "cut_cause": cut.cause} if cut is not None else {}),
            **({"train_metric_states": metric_states} if metric_states is not None else {})})
    run.callbacks.on_checkpoint(run, str(checkpoint_path(directory)))


def save_mid_epoch(run: Any, at: Position, cut: Any = None) -> None:
    """Save after batch ``at.batch``; every process keeps its own partial sums (and, with
    ``train_metrics``, its metric objects' states)."""
    sums = run.collective.all_gather(torch.tensor([at.loss_sum, at.count] + at.figures, dtype=torch.float64))
    figures = run.engine.train_figures
    states = None
    if figures is not None and figures.stateful_names():
        mine = figures.states()
        states = run.collective.all_gather_object(mine) if run.world_size > 1 else [mine]
    save(run, at, [t.tolist() for t in sums], cut, states)


def resume(run: Any) -> Tuple[Dict[str, Any], Position]:
    """Load the checkpoint into ``run`` (model, optimizer, scheduler, history, random state,
    callbacks...) and return it with where it stopped."""
    directory = run.config.checkpoint_dir
    state = load_checkpoint(directory)
    saved, ours = json.loads(state["identity"]), run.identity()
    different = {k: (saved.get(k), ours[k]) for k in SAME if saved.get(k) != ours[k]}
    # Checkpoints of older versions do not say what they trained: those keys are compared if saved.
    different.update({k: (saved[k], ours[k]) for k in TRAINED if k in saved and saved[k] != ours[k]})
    if different:
        what = ", ".join(f"{k} {around_difference(a, b)!r} (this run: {around_difference(b, a)!r})"
                         if isinstance(a, str) and isinstance(b, str) else f"{k} {a!r} (this run: {b!r})"
                         for k, (a, b) in different.items())
        raise CheckpointError(f"the checkpoint in {directory} is of another run: {what}; "
                              f"resume with the same settings, or use another --checkpoint-dir")
    if run.batches is not None and state["batch"] > run.batches:
        raise CheckpointError(f"the checkpoint stopped after batch {state['batch']} of epoch {state['epoch']}, but "
                              f"this run's epochs have {run.batches} batches (--max-batches): resume "
                              f"with --max-batches {state['batch']} or more, or without it")
    try:
        run.engine.load_state_dict(state["engine"])
        if run.scheduler is not None:
            if state.get("scheduler") is None:
                raise ValueError("it has no learning-rate scheduler state, and this run has a scheduler")
            run.scheduler.load_state_dict(state["scheduler"])
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"cannot resume from {checkpoint_path(directory)}: {e}") from None
    set_rng_state(state["rng"], run.rank, run.devices)
    streams = state.get("streams") or []
    run.engine.random.load_state(streams[run.rank] if run.rank < len(streams) else [])
    if run.balancer is not None and state.get("balance"):
        notice = run.balancer.load_state_dict(state["balance"])
        if notice:
            run.log(f"resuming with {notice}")
    fresh = run.callbacks.load_state_dict(state.get("callbacks"))
    if fresh:
        run.log(f"resuming: the checkpoint has no state for callback(s) {', '.join(fresh)}; they start afresh")
    run.history[:] = json.loads(state["history"])
    if run.step_log is not None:
        run.step_log.rows[:] = json.loads(state.get("step_history", "[]"))
        run.step_log.restore(state.get("step_window"), run.rank)
    run.skipped = state["skipped"]
    partial = state["partial"]
    if len(partial) != run.world_size:     # another number of processes: rank 0 carries the sums
        partial = [[sum(column) for column in zip(*partial)]] + [[0.0] * len(partial[0])] * (run.world_size - 1)
    loss, count, *figures = partial[run.rank]
    run.log(f"resumed from {checkpoint_path(directory)} at epoch {state['epoch']}, batch {state['batch']}")
    if len(figures) != len(run.figure_keys):
        if state["batch"] and run.figure_keys:
            run.log(f"resuming: the checkpoint has no train_metrics sums for epoch {state['epoch']}: its training "
                    f"figures cover batches {state['batch'] + 1} to {run.batches or 'its end'} only")
        figures = [0.0] * len(run.figure_keys)
    objects = run.engine.train_figures.stateful_names() if run.engine.train_figures is not None else None
    states = state.get("train_metric_states")
    if state["batch"] and objects and states is not None:      # rank 0 takes them all if the processes differ
        run.engine.train_figures.saved = [states[run.rank]] if len(states) == run.world_size else \
            states if run.rank == 0 else []
    elif state["batch"] and objects:
        run.log(f"resuming mid-epoch: the metric objects' {', '.join(objects)} of epoch {state['epoch']} are NaN "
                f"(the checkpoint has not their state); later epochs have them")
    _say_what_changed(run, saved, ours)
    return state, Position(state["epoch"], state["batch"], loss, count, state["seconds"], state["epoch_skipped"],
                           figures)


def _say_what_changed(run: Any, saved: Dict[str, Any], ours: Dict[str, Any]) -> None:
    """One line per setting a resumed run changes; what it changes is honoured."""
    given = run.config.lr is not None or run.task.lr is not None       # (--lr, or fit's lr=)
    if given and run.lr is not None and saved.get("lr") is not None and saved["lr"] != run.lr:
        run.engine.trainer.set_learning_rate(run.lr)
        run.log(f"resuming with --lr {run.lr:g} (the checkpoint's run had {saved['lr']!r})")
    else:
        run.lr = saved.get("lr", run.lr)
    if saved.get("kvstore") != ours["kvstore"]:
        run.log(f"resuming with kvstore {ours['kvstore']!r} (the checkpoint's run had {saved.get('kvstore')!r}): "
                f"the same gradient sums, up to float rounding")
    if (saved.get("devices"), saved.get("world_size")) != (ours["devices"], ours["world_size"]):
        def where(devices, world):
            devices = devices if isinstance(devices, list) else [f"{devices} device(s)"]
            return f"{world} process(es) x [{', '.join(devices)}]"
        bn = "; per-device BatchNorm statistics depend on the device count (--sync-bn does not)" \
            if has_batchnorm(run.task.model) and not run.config.sync_batchnorm else ""
        run.log(f"resuming on {where(ours['devices'], ours['world_size'])} (the checkpoint's run: "
                f"{where(saved.get('devices'), saved.get('world_size'))}): the same global batches, so the "
                f"same training up to float rounding{bn}")


def load_weights(module: nn.Module, path: str) -> nn.Module:
    """Load the trained weights a run left into ``module`` (a fresh one of the same class):
    ``path`` is a run's checkpoint folder (or its ``checkpoint.pt``: its digest is checked) or
    a ``BestCheckpoint`` file. Returns ``module``.

    >>> model = dptrain.load_weights(Net(), "runs/own")          # the last checkpoint's weights
    >>> model = dptrain.load_weights(Net(), "runs/best.pt")      # the best epoch's
    """
    where = Path(path)
    if where.is_dir() or where.name == FILENAME:
        state = load_checkpoint(where if where.is_dir() else where.parent)["engine"]["model"]
    else:
        try:
            state = torch.load(where, map_location="cpu", weights_only=True)["model"]
        except (OSError, RuntimeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{where} is not a checkpoint folder, checkpoint.pt or BestCheckpoint file "
                                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    try:
        module.load_state_dict(without_prefix(state))
    except RuntimeError as e:
        raise ValueError(f"the weights in {where} do not fit {type(module).__name__}: "
                         f"{str(e).splitlines()[0]}") from None
    return module
