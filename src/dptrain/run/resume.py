"""What a run saves, and how a run resumes from it (``Run``'s checkpoint half).

A checkpoint holds the run's identity (task, dataset, global batch, seed: what a resumed run
must share), the model, optimizer and scheduler state, the epoch and batch reached, every
process's partial loss sums, the history, every process's random state and the ``--balance``
sizes in force. A resumed run checks the identity, takes the rest, and says in one line each
setting it changes (learning rate, kvstore, devices, processes), honouring the change.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import torch
from torch import nn

from ..core.errors import CheckpointError
from ..outputs.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


class Resumable:
    """Checkpoint saving and resuming, for ``loop.Run`` (which gives the attributes used here:
    config, env, task, engine, scheduler, balancer, collective, devices, history...)."""

    def _identity(self) -> Dict[str, Any]:
        return {"recipe": self.task.name, "dataset": self.task.dataset, "batch_size": self.batch_size,
                "seed": self.config.seed, "devices": self._names(), "world_size": self.env.world_size,
                "lr": self.lr, "kvstore": self.kvstore}

    def _rng_states(self) -> List[torch.Tensor]:
        """Every process's random state (CPU, and its GPUs'), for dropout and the like."""
        state = torch.get_rng_state()
        cuda = [d for d in self.devices if d.type == "cuda"]
        if cuda:
            state = torch.cat([state] + [torch.cuda.get_rng_state(d) for d in cuda])
        return [s.cpu() for s in self.collective.all_gather(state)]

    def _set_rng_state(self, states: List[torch.Tensor]) -> None:
        state = states[self.env.rank] if self.env.rank < len(states) else states[0]
        cpu = torch.get_rng_state()
        torch.set_rng_state(state[:cpu.numel()])
        rest = state[cpu.numel():]
        for d in (d for d in self.devices if d.type == "cuda"):
            n = torch.cuda.get_rng_state(d).numel()
            if rest.numel() >= n:
                torch.cuda.set_rng_state(rest[:n], d)
                rest = rest[n:]

    def _save(self, epoch: int, batch: int, partial: List[List[float]], seconds: float,
              epoch_skipped: int = 0) -> None:
        """Rank 0 writes; ``partial`` holds every process's ``[loss sum, denominator]`` so far.
        Every process calls it (they send their random states)."""
        if not self.config.checkpoint_dir:
            return
        rng = self._rng_states()
        if self.env.rank != 0:
            return
        save_checkpoint(self.config.checkpoint_dir, {
            "identity": json.dumps(self._identity()), "epoch": epoch, "batch": batch,
            "partial": partial, "seconds": seconds, "skipped": self.skipped, "epoch_skipped": epoch_skipped,
            "history": json.dumps(self.history), "engine": self.engine.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "balance": self.balancer.state_dict() if self.balancer is not None else None,
            "rng": rng})

    #: What a resumed run must share with the checkpoint's: the task and the global batches.
    SAME = ("recipe", "dataset", "batch_size", "seed")

    def _resume(self) -> None:
        state = load_checkpoint(self.config.checkpoint_dir)
        saved, ours = json.loads(state["identity"]), self._identity()
        different = {k: (saved.get(k), ours[k]) for k in self.SAME if saved.get(k) != ours[k]}
        if different:
            what = ", ".join(f"{k} {a!r} (this run: {b!r})" for k, (a, b) in different.items())
            raise CheckpointError(f"the checkpoint in {self.config.checkpoint_dir} is of another run: {what}; "
                                  f"resume with the same settings, or use another --checkpoint-dir")
        if state["batch"] > len(self.train_loader):
            raise CheckpointError(f"the checkpoint stopped after batch {state['batch']} of epoch {state['epoch']}, but "
                                  f"this run's epochs have {len(self.train_loader)} batches (--max-batches): resume "
                                  f"with --max-batches {state['batch']} or more, or without it")
        try:
            self.engine.load_state_dict(state["engine"])
            if self.scheduler is not None:
                if state.get("scheduler") is None:
                    raise ValueError("it has no learning-rate scheduler state, and this run has a scheduler")
                self.scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"cannot resume from {checkpoint_path(self.config.checkpoint_dir)}: {e}") from None
        self._set_rng_state(state["rng"])
        if self.balancer is not None and state.get("balance"):
            notice = self.balancer.load_state_dict(state["balance"])
            if notice:
                self.log(f"resuming with {notice}")
        self.history = json.loads(state["history"])
        self.skipped = state["skipped"]
        partial = state["partial"]
        if len(partial) != self.env.world_size:     # another number of processes: rank 0 carries the sums
            partial = [[sum(p[0] for p in partial), sum(p[1] for p in partial)]] + \
                [[0.0, 0.0]] * (self.env.world_size - 1)
        loss, count = partial[self.env.rank]
        self.position = (state["epoch"], state["batch"], loss, count, state["seconds"], state["epoch_skipped"])
        self.log(f"resumed from {checkpoint_path(self.config.checkpoint_dir)} at epoch {state['epoch']}, "
                 f"batch {state['batch']}")
        self._say_what_changed(saved, ours)

    def _say_what_changed(self, saved: Dict[str, Any], ours: Dict[str, Any]) -> None:
        """One line per setting a resumed run changes; what it changes is honoured."""
        if self.config.lr is not None and saved.get("lr") != self.config.lr:
            self.engine.trainer.set_learning_rate(self.config.lr)
            self.log(f"resuming with --lr {self.config.lr:g} (the checkpoint's run had {saved.get('lr')!r})")
        else:
            self.lr = saved.get("lr", self.lr)
        if saved.get("kvstore") != ours["kvstore"]:
            self.log(f"resuming with kvstore {ours['kvstore']!r} (the checkpoint's run had {saved.get('kvstore')!r}): "
                     f"the same gradient sums, up to float rounding")
        if (saved.get("devices"), saved.get("world_size")) != (ours["devices"], ours["world_size"]):
            def where(devices, world):
                devices = devices if isinstance(devices, list) else [f"{devices} device(s)"]
                return f"{world} process(es) x [{', '.join(devices)}]"
            bn = "; per-device BatchNorm statistics depend on the device count (--sync-bn does not)" \
                if has_batchnorm(self.task.model) and not self.config.sync_bn else ""
            self.log(f"resuming on {where(ours['devices'], ours['world_size'])} (the checkpoint's run: "
                     f"{where(saved.get('devices'), saved.get('world_size'))}): the same global batches, so the "
                     f"same training up to float rounding{bn}")
