"""The run as a callback sees it (``run`` in every hook): its figures, the model, the
optimizer, and the few things a callback may do to the run.

    rank, world_size, is_main        this process; is_main: rank 0 (the one that prints)
    epoch, epochs, step, batches     where the run is (step: batches done in the run; batches:
                                     an epoch's, None for a stream without __len__)
    model, optimizer, scheduler      the module being trained, its optimizer (param_groups)
    task, train_data, batch_size     what is trained (forward, step, collate_fn), the training data
                                     as read (validation_split's part held out), the global batch
    history, devices                 the epoch rows so far, this process's devices
    log(line), stop(reason)          print (rank 0), end the run in step on every process
    record(row)                      an epoch row with what the run is (metrics files)
    load_weights(state_dict)         into the model on every device of this process
    evaluated_weights()              what the epoch's evaluation ran on
    evaluated_epoch                  whether this epoch was evaluated (eval_every skips some)
    evaluate()                       the test_* figures of the model as it is now (every process)
    hold_scheduler()                 the run's scheduler steps no more: the callback sets the lr

``Run`` (``loop.py``) sets the figures and drives the hooks; this class holds the methods.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from . import report


class RunView:
    """What callbacks use of a ``Run`` (see the module docstring)."""

    @property
    def model(self) -> torch.nn.Module:
        """The module being trained (the first replica: the user's own module)."""
        return self.engine.replicas[0]

    @property
    def optimizer(self):
        return self.engine.trainer.optimizer

    @property
    def train_data(self) -> Any:
        """The training data as the run read it (a ``Dataset``, tensors, a ``DataLoader``...;
        with ``validation_split``, the part it trains on)."""
        return self.train_loader.source

    def hold_scheduler(self, from_epoch: Optional[int] = None) -> None:
        """Step the run's learning-rate scheduler no more in this run, from the next batch on (or
        from epoch ``from_epoch``'s start, counted from 1): the callback sets the learning rate
        itself (``SWA`` anneals it, as Lightning's swaps the scheduler). Call it in every process,
        and again in a resumed run (the checkpoint keeps the scheduler as it was held). Said in
        ``on_fit_start`` with ``from_epoch``, a scheduler counting its steps (``OneCycleLR``) needs
        only those until then."""
        self.schedule.hold(from_epoch, self.epoch)

    def evaluate(self) -> Dict[str, float]:
        """The ``test_*`` figures (and each other set's ``test_<name>_*``) of the model as it is
        now on the run's evaluation sets, over every device and process: call it in every
        process at the same point (``on_fit_end``, after loading other weights). Empty
        without an evaluation set."""
        if self.eval_loader is None:
            return {}
        return {**report.figures_over(self.engine, self.eval_loader, self.collective),
                **report.other_sets(self.engine, self.other_evals, self.collective)}

    def load_weights(self, weights: Dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (a model ``state_dict``) into the model on every device of this
        process, in place (the optimizer keeps its parameters). Loaded between
        ``on_evaluate_start`` and the evaluation, they are what it evaluates (and
        ``evaluated_weights`` gives them); load the trained ones back at ``on_evaluate_end``."""
        self.engine.load_weights(weights, "the weights given to run.load_weights")
        self._loaded = weights

    def evaluated_weights(self) -> Dict[str, torch.Tensor]:
        """The weights the epoch's evaluation ran on: those a callback loaded for it
        (``EMA(evaluate=True)``), else the model's own. Read them before training goes on."""
        return self._evaluated if self._evaluated is not None else self.model.state_dict()

    def stop(self, reason: str = "a callback asked") -> None:
        """End the run in step on every process (see ``callbacks/base.py``)."""
        self.stop_reason = self.stop_reason or reason
        self.stops.request()

    def record(self, row: Dict[str, Any]) -> Dict[str, Any]:
        """An epoch row with what the run is (recipe, devices, processes, samples): a metrics
        file's line."""
        return report.record(row, self.task.name, self.device_names, self.world_size,
                             self.train_loader.global_num_samples)
