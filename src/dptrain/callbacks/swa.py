"""Stochastic Weight Averaging (Izmailov et al., 2018): the weights averaged over the last
epochs while they train at an annealed learning rate, then BatchNorm's statistics recomputed
for the average. It is torch's ``swa_utils`` recipe run by the loop, and tested equal to it:

    swa_model, swa_scheduler = AveragedModel(model), SWALR(optimizer, swa_lr=0.05)
    for epoch in range(epochs):
        train_one_epoch(model)
        if epoch >= swa_start:
            swa_model.update_parameters(model); swa_scheduler.step()
        else:
            scheduler.step()
    update_bn(train_loader, swa_model)

Here that is one callback, on any devices and processes, kept in checkpoints:

    swa = SWA(swa_lrs=0.05, swa_epoch_start=0.75)       # average the last quarter of the epochs
    dptrain.fit(model, train, test, epochs=40, scheduler=cosine, callbacks=[swa])
    # the model ends with the average (BatchNorm's statistics its own); result's test_* are its

``update_bn`` is torch's ``update_bn`` for any data ``fit`` takes (a ``Dataset`` of dicts, a
``DataLoader``, tensors), for an average a user keeps himself.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn
from torch.optim.swa_utils import SWALR

from ..data.batch import to_device
from ..data.choose_loader import make_loader
from ..engine.batch_call import model_input
from ..engine.lightning_module import LightningSteps
from .base import Callback

Average = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
STRATEGIES = ("cos", "linear")


def batchnorm_layers(model: nn.Module) -> List[nn.modules.batchnorm._BatchNorm]:
    """The layers of ``model`` that keep running statistics."""
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


@torch.no_grad()
def update_bn(model: nn.Module, data: Any, *, batch_size: int = 256, forward: Optional[Callable] = None,
              collate_fn: Optional[Callable] = None, device: Optional[torch.device] = None) -> int:
    """Recompute the running statistics of ``model``'s BatchNorm layers over ``data`` (torch's
    ``swa_utils.update_bn``, for any data ``fit`` takes): each layer's running mean and variance
    become the average, over the batches, of each batch's, from one pass in train mode without
    gradients, in the data's order; each module's mode and each layer's momentum are put back.
    Return the batches read (0: no BatchNorm layer, nothing read).

    ``forward(model, batch)``: how a batch meets the model (default: as in ``predict``, the
    target left out); ``device``: where batches go (default: the model's). One process alone.

    >>> dptrain.update_bn(averaged, fashion_mnist_train, batch_size=128)   # averaged(x) for x, y: 60,000 / 128
    469
    """
    layers = batchnorm_layers(model)
    if not layers:
        return 0
    if device is None:
        device = next(iter(layers[0].buffers())).device
    loader = make_loader(data, batch_size, collate_fn=collate_fn, to_the_end=True)
    feed = forward or model_input
    modes = [(m, m.training) for m in model.modules()]
    momenta = [m.momentum for m in layers]
    read = 0
    try:
        for layer in layers:
            layer.reset_running_stats()
            layer.momentum = None           # (a cumulative average: every batch weighs the same)
        model.train()
        for batch in loader:
            feed(model, to_device(batch, device))
            read += 1
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
        for m, mode in modes:
            m.training = mode
        if hasattr(loader, "close"):
            loader.close()
    return read


def equal_average(averaged: torch.Tensor, current: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The mean of ``count`` weights and one more: torch's ``AveragedModel`` default."""
    return averaged + (current - averaged) / (count + 1)


class SWA(Callback):
    """Average the weights at the end of every epoch from ``swa_epoch_start`` on, with the
    learning rate annealed to ``swa_lrs`` over ``annealing_epochs`` by torch's ``SWALR``
    (``annealing_strategy`` ``"cos"`` or ``"linear"``; 0 epochs: ``swa_lrs`` at once); the run's
    own scheduler steps no more from that epoch. At the end the model gets the average on
    every device and process, its BatchNorm statistics recomputed over the training data
    (``update_bn``, in global batches, in order; ``update_bn=False`` keeps the last epoch's
    buffers), and the result's ``test_*`` figures are the average's.

    Lightning's ``StochasticWeightAveraging`` settings, with their defaults: ``swa_lrs`` (one
    rate, or one per parameter group), ``swa_epoch_start`` (the first averaged epoch, counted
    from 1, or a fraction of the epochs: 0.8 of 10 is epoch 8), ``avg_fn(averaged, current,
    count) -> averaged`` (default: the equal mean). Lightning averages at each epoch's start,
    so its average leaves out the last epoch; this one, torch's recipe's, takes it in.
    ``forward(model, batch)``: the BatchNorm pass's call (default: the run's ``forward`` or
    ``step``, else as in ``predict``). Parameters are averaged on the model's device; buffers
    are the model's.

    >>> swa = SWA(swa_lrs=1e-2); dptrain.fit(model, data, epochs=20, callbacks=[swa]); swa.averaged
    5
    """

    def __init__(self, swa_lrs: Union[float, Sequence[float]], swa_epoch_start: Union[int, float] = 0.8,
                 annealing_epochs: int = 10, annealing_strategy: str = "cos", avg_fn: Optional[Average] = None,
                 update_bn: bool = True, forward: Optional[Callable] = None):
        many = isinstance(swa_lrs, (list, tuple))
        rates = list(swa_lrs) if many else [swa_lrs]
        if not rates or not all(_positive(r) for r in rates):
            raise ValueError(f"swa_lrs must be a learning rate > 0, or a list of them (one per parameter group), "
                             f"got {swa_lrs!r}")
        whole = isinstance(swa_epoch_start, int) and not isinstance(swa_epoch_start, bool)
        if not (whole and swa_epoch_start >= 1) and not (isinstance(swa_epoch_start, float)
                                                          and 0.0 <= swa_epoch_start <= 1.0):
            raise ValueError(f"swa_epoch_start must be an epoch >= 1 (the first averaged) or a fraction of the "
                             f"epochs in [0, 1], got {swa_epoch_start!r}")
        if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ValueError(f"annealing_epochs must be a whole number >= 0, got {annealing_epochs!r}")
        if annealing_strategy not in STRATEGIES:
            raise ValueError(f"annealing_strategy must be one of {STRATEGIES}, got {annealing_strategy!r}")
        for name, fn in (("avg_fn", avg_fn), ("forward", forward)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable (or None), got {type(fn).__name__}")
        if not isinstance(update_bn, bool):
            raise TypeError(f"update_bn must be True or False, got {update_bn!r}")
        self.swa_lrs: Union[float, List[float]] = [float(r) for r in rates] if many else float(rates[0])
        self.swa_epoch_start, self.annealing_epochs = swa_epoch_start, annealing_epochs
        self.annealing_strategy, self.avg_fn = annealing_strategy, avg_fn or equal_average
        self.update_bn, self.forward = update_bn, forward
        self.weights: Dict[str, torch.Tensor] = {}    # the average of the parameters, by name
        self.averaged = 0                             # epochs in it
        self.start: Optional[int] = None              # the first averaged epoch, once the run's are known
        self._annealing: Optional[SWALR] = None
        self._annealed: Optional[Dict[str, Any]] = None   # SWALR's state from a checkpoint
        self._resumed = False                             # load_state_dict gave the state this run goes on from

    def first_epoch(self, epochs: int) -> int:
        """The first averaged epoch of a run of ``epochs`` (counted from 1)."""
        if isinstance(self.swa_epoch_start, float):
            return max(1, int(epochs * self.swa_epoch_start))
        return self.swa_epoch_start

    def on_fit_start(self, run: Any) -> None:
        groups = getattr(run.optimizer, "param_groups", None)
        if groups is None:
            raise TypeError(f"SWA anneals the learning rate of the optimizer every update trains; this run's "
                            f"optimizers take turns ({', '.join(map(str, run.optimizer))}): average a run of one "
                            f"optimizer, or of several on one loss (a CombinedOptimizer)")
        if isinstance(self.swa_lrs, list) and len(self.swa_lrs) != len(groups):
            raise ValueError(f"swa_lrs has {len(self.swa_lrs)} rates, the optimizer {len(groups)} parameter groups: "
                             f"give one rate for all, or one per group")
        self.start = self.first_epoch(run.epochs)
        if self.start > run.epochs:
            raise ValueError(f"SWA(swa_epoch_start={self.swa_epoch_start!r}) starts at epoch {self.start}, after the "
                             f"run's last ({run.epochs}): nothing would be averaged; give swa_epoch_start <= "
                             f"{run.epochs}, or a fraction of the epochs (0.8)")
        # Each run anneals its own optimizer, and averages afresh unless it resumes (an object
        # given to a second fit would have annealed the first run's optimizer, with its average).
        self._annealing = None
        if not self._resumed:
            self.weights, self.averaged, self._annealed = {}, 0, None
        self._resumed = False
        params = dict(run.model.named_parameters())
        self.weights = {k: v.to(params[k].device) for k, v in self.weights.items()}   # (resumed: from the CPU)
        run.hold_scheduler(from_epoch=self.start)      # (a OneCycleLR need count only the steps before it)

    def on_epoch_start(self, run: Any, epoch: int) -> None:
        if epoch < self.start:
            return
        run.hold_scheduler()
        if self._annealing is None:
            self._annealing = SWALR(run.optimizer, swa_lr=self.swa_lrs, anneal_epochs=self.annealing_epochs,
                                    anneal_strategy=self.annealing_strategy)
            if self._annealed is not None:          # (resumed within the averaged epochs)
                self._annealing.load_state_dict(self._annealed)
            run.log(f"SWA: epoch {epoch} on: the weights averaged at each epoch's end, the learning rate annealed "
                    f"to {self.swa_lrs} over {self.annealing_epochs} epochs ({self.annealing_strategy})")

    @torch.no_grad()
    def on_epoch_end(self, run: Any, epoch: int, row: Dict[str, Any]) -> None:
        if epoch < self.start:
            return
        count = torch.tensor(self.averaged)
        for name, p in run.model.named_parameters():
            if name not in self.weights:
                self.weights[name] = p.detach().clone()
            elif p.is_floating_point():
                self.weights[name].copy_(self.avg_fn(self.weights[name], p.detach(), count.to(p.device)))
        self.averaged += 1
        self._annealing.step()

    def on_fit_end(self, run: Any, result: Dict[str, Any]) -> None:
        if not self.averaged:
            run.log(f"SWA: the run ended before epoch {self.start}, its first averaged: the model is the trained one")
            return
        run.load_weights(self.averaged_state(run.model))
        said = ""
        if self.update_bn and batchnorm_layers(run.model):
            batches = update_bn(run.model, run.train_data, batch_size=run.batch_size, forward=self._feed(run),
                                collate_fn=run.task.collate_fn, device=run.devices[0])
            run.load_weights(run.model.state_dict())      # (its statistics on every device)
            said = f"; BatchNorm statistics recomputed over the training data ({batches} batches)"
        figures = run.evaluate()
        trained = {k: result[k] for k in figures if k in result}
        result.update(figures, swa_epochs=self.averaged)
        shown = ", ".join(f"{k} {v:.4g} (trained: {trained[k]:.4g})" for k, v in figures.items()
                          if k in trained and isinstance(v, float) and k.count("_") == 1)
        run.log(f"SWA: the model is the average of epochs {self.start}-{self.start + self.averaged - 1}{said}"
                + (f"; {shown}" if shown else ""))

    def averaged_state(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """``model``'s state with the average for its parameters, under each of their names
        (a weight tied to two layers is in the state twice, averaged once)."""
        named = {id(p): name for name, p in model.named_parameters()}
        state = model.state_dict()
        for alias, p in model.named_parameters(remove_duplicate=False):
            if named[id(p)] in self.weights:
                state[alias] = self.weights[named[id(p)]]
        return state

    def _feed(self, run: Any) -> Optional[Callable]:
        """How the BatchNorm pass calls the model: ``forward=``, else the run's own (its
        ``forward``, or a step function's whole step), else as in ``predict``."""
        if self.forward is not None:
            return self.forward
        task = run.task
        if task.forward is not None:
            return task.forward
        if callable(task.step) and not isinstance(task.step, LightningSteps):
            return task.step
        return None

    def state_dict(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"weights": {k: v.detach().cpu() for k, v in self.weights.items()},
                                 "averaged": self.averaged}
        if self._annealing is not None:         # (plain values: checkpoints load with weights_only)
            state["annealing"] = {k: v for k, v in self._annealing.state_dict().items() if not callable(v)}
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.weights = {k: v.clone() for k, v in state["weights"].items()}
        self.averaged, self._annealed, self._resumed = state["averaged"], state.get("annealing"), True


def _positive(rate: Any) -> bool:
    return isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0
