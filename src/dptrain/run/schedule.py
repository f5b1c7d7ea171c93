"""When the learning-rate scheduler steps: after each epoch or each batch (``scheduler_interval``),
and a ``ReduceLROnPlateau`` on which figure.

A plateau scheduler needs a figure: stepped every epoch, the epoch's test loss (the training
loss without an evaluation set; an epoch ``eval_every`` does not evaluate is no step); stepped
every batch, each ``eval_every_n_steps`` evaluation's test loss (Lightning's ``"interval":
"step"`` with a monitor), and a batch interval without those evaluations is an error.
``scheduler_monitor`` names another figure of the row (Keras's ``monitor``, Lightning's
``"monitor"``; the epoch's scheduler steps after the callbacks' ``on_epoch_end``, so a figure one
adds, or a LightningModule's epoch-end hook logs, may be it), and a plateau whose ``mode`` takes
its figure the wrong way is an error.

A LightningModule's run steps its other epoch schedulers where Lightning's ``Trainer`` does,
after the epoch's last update (``lightning_order``); a plain module's after ``on_epoch_end``,
as a plain loop's ``train(); validate(); scheduler.step()``.

A scheduler that takes its counts from the training code (timm's: ``step(epoch, metric=None)``
at each epoch's end, ``step_update(num_updates, metric=None)`` after each update; ``counted``)
gets both, as timm's training script gives them, whatever the interval: the epochs done, and
the updates done in the whole run (a resumed run goes on counting).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional

import torch

from ..callbacks.monitor import auto_mode, check_evaluated, peer_figure

PLATEAU = torch.optim.lr_scheduler.ReduceLROnPlateau


def counted(scheduler: Any) -> bool:
    """Whether ``scheduler`` takes its counts from the training code (timm's shape: a ``step``
    that needs the epoch, and a ``step_update``)."""
    try:
        epoch = next(iter(inspect.signature(scheduler.step).parameters.values()), None)
    except (TypeError, ValueError, AttributeError):
        return False
    return callable(getattr(scheduler, "step_update", None)) and epoch is not None and \
        epoch.default is inspect.Parameter.empty


def make_scheduler(factory: Any, optimizer: Any) -> Optional[Any]:
    """``factory(optimizer)``; with several optimizers (``{name: optimizer}``) one scheduler
    for each, from one factory or a dict of them by name (``Schedulers``); a dict for a
    combined optimizer: one for each part named (``optimizer.parts``); None without one."""
    if factory is None:
        return None
    if isinstance(factory, dict) and not isinstance(optimizer, dict):
        optimizer = optimizer.parts         # (Task checked the names: its parts')
    if not isinstance(optimizer, dict):
        return factory(optimizer)
    made = {name: (factory.get(name) if isinstance(factory, dict) else factory) for name in optimizer}
    return Schedulers({name: f(optimizer[name]) for name, f in made.items() if f is not None})


class Schedulers:
    """Several optimizers' schedulers, stepped together (all plateau ones, or none)."""

    def __init__(self, schedulers: Dict[str, Any]):
        self.schedulers = schedulers
        kinds = {isinstance(s, PLATEAU) for s in schedulers.values()}
        if len(kinds) > 1:
            raise ValueError("the schedulers mix ReduceLROnPlateau with others, which step at other points: use one "
                             "kind for every optimizer")
        self.plateau = kinds == {True}

    def step(self, *figure: Any) -> None:
        for s in self.schedulers.values():
            s.step(*figure)

    def step_update(self, num_updates: int, metric: Any = None) -> None:
        for s in self.schedulers.values():
            s.step_update(num_updates, metric)

    def state_dict(self) -> Dict[str, Any]:
        return {name: s.state_dict() for name, s in self.schedulers.items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if set(state) != set(self.schedulers):
            raise ValueError(f"it holds the schedulers of {sorted(state)}, this run has {sorted(self.schedulers)}")
        for name, s in self.schedulers.items():
            s.load_state_dict(state[name])


class Schedule:
    """Steps ``scheduler`` (None: nothing to step) at the points its interval names; a plateau
    on ``monitor`` (a figure of the row: ``test_acc``, Keras's ``val_accuracy``; None: the
    test loss, or the training loss without an evaluation set)."""

    def __init__(self, scheduler: Optional[Any], interval: str, eval_every_n_steps: Optional[int],
                 monitor: Optional[str] = None):
        self.scheduler = scheduler
        self.plateau = isinstance(scheduler, PLATEAU) or getattr(scheduler, "plateau", False) is True
        kinds = {counted(s) for s in self._each() if s is not None}
        if len(kinds) > 1:
            raise ValueError("the schedulers mix timm's kind (step(epoch), step_update(num_updates)) with torch's: use "
                             "one kind for every optimizer")
        #: Stepped as timm's training script steps it: ``step(epoch)`` and ``step_update(updates)``.
        self.counted = kinds == {True}
        self.per_batch = scheduler is not None and (interval == "batch" or self.counted)
        self.per_epoch = scheduler is not None and (interval == "epoch" or self.counted)
        self.interval = interval
        #: A LightningModule's ``lr_scheduler_step(scheduler, metric)``, which steps each scheduler
        #: at its interval in place of ``step()`` (``stepped_by``); None: the scheduler's own.
        self.hook: Optional[Callable[..., None]] = None
        self.asked, self.monitor = monitor, None if monitor is None else peer_figure(monitor)
        #: The epoch from whose start a callback holds the scheduler (``hold(from_epoch)``), once said.
        self.held_from: Optional[int] = None
        self.held = False
        #: Lightning's order (a LightningModule's run, ``lightning_order``): an epoch interval's
        #: scheduler, a plateau aside, steps after the epoch's last update (``after_last_update``).
        self.at_last_update = False
        #: The rates the epoch trained at, read before such a step (the row's ``lr``); None: not stepped so.
        self.trained_rates: Optional[Dict[str, float]] = None
        if monitor is not None and not self.plateau and not self.counted:
            which = "there is no scheduler" if scheduler is None else f"{type(scheduler).__name__} is none"
            raise ValueError(f"scheduler_monitor={monitor!r} names the figure a ReduceLROnPlateau decides on, and "
                             f"{which}: drop scheduler_monitor")
        if self.plateau and self.per_batch and not eval_every_n_steps:
            raise ValueError("ReduceLROnPlateau stepped every batch has no figure to decide on: give "
                             "scheduler_interval='epoch' (each epoch's test loss), or eval_every_n_steps=N "
                             "(each of those evaluations' test loss)")
        if self.plateau or self.counted:        # (timm's plateau kind holds torch's: lr_scheduler)
            self._check_modes(monitor)

    def _each(self) -> List[Any]:
        """The schedulers stepped (several optimizers': each one's)."""
        return list(getattr(self.scheduler, "schedulers", {"": self.scheduler}).values())

    def _check_modes(self, monitor: Optional[str]) -> None:
        """A plateau whose mode takes the figure the wrong way (``mode="max"`` on a loss) would
        cut the learning rate while the figure gets better: an error before the run."""
        figure = self.monitor or "test_loss"
        try:
            better = auto_mode(figure)
        except ValueError:          # (a name that does not say: the user's mode is taken)
            return
        for plateau in self._each():
            plateau = getattr(plateau, "lr_scheduler", None) if self.counted else plateau
            if plateau is not None and getattr(plateau, "mode", better) != better:
                shown = f"scheduler_monitor={monitor!r}" if monitor else "the test loss (scheduler_monitor None)"
                raise ValueError(f"ReduceLROnPlateau(mode={plateau.mode!r}) decides on {shown}, of which "
                                 f"{'larger' if better == 'max' else 'smaller'} is better: give it mode={better!r}"
                                 + ("" if monitor else ", or scheduler_monitor='test_acc' to decide on a score"))

    def check_start(self, run: Any) -> None:
        """A plateau on an evaluation figure (``scheduler_monitor="test_acc"``) in a run with no
        evaluation set: an error before the first epoch, not after it."""
        if self.monitor is not None:
            check_evaluated(run, self.asked, f"scheduler_monitor={self.asked!r}")

    def check_length(self, updates: Optional[int], epochs: int, log: Callable[[str], None]) -> None:
        """A scheduler that counts its steps (``OneCycleLR``'s ``total_steps``) raises at the step
        past them: stepped more times than that by this run (``updates`` and ``epochs`` it has
        left at most, until a callback holds it: ``held_from``), an error now, not hours in;
        stepped every epoch far fewer times than it counts, a line saying its schedule is counted
        in steps."""
        if self.held:
            return
        for scheduler in self._each():
            total = getattr(scheduler, "total_steps", None)
            if not isinstance(total, int) or self.plateau or scheduler is None:
                continue
            kind, left = type(scheduler).__name__, total - scheduler.last_epoch
            steps = updates if self.per_batch else epochs
            if steps is not None and steps > left:
                unit = "update" if self.per_batch else "epoch"
                raise ValueError(f"{kind}(total_steps={total}) is stepped every {unit}, {steps} times in this run, and "
                                 f"raises at its step {total + 1}: give it total_steps={scheduler.last_epoch + steps}"
                                 + (" (epochs x batches per epoch, with accumulate_grad_batches: those over k)"
                                    if self.per_batch else " (or scheduler_interval='batch', to count updates)"))
            if self.per_epoch and left > epochs:
                log(f"dptrain: {kind}(total_steps={total}) is stepped every epoch, {epochs} times in this run, its "
                    f"schedule {left} steps long: give scheduler_interval='batch' if its steps are updates")

    def figure(self, row: Dict[str, Any]) -> float:
        """The figure the plateau decides on in ``row``."""
        if self.monitor is None:
            return row["test_loss"] if "test_loss" in row else row["train_loss"]
        if self.monitor not in row:
            raise ValueError(f"scheduler_monitor {self.monitor!r} is not in the row's figures "
                             f"({', '.join(k for k in row if k not in ('epoch', 'sec', 'step'))}): name one of them")
        return row[self.monitor]

    def hold(self, from_epoch: Optional[int] = None, epoch: int = 0) -> None:
        """Step the scheduler no more in this run: a callback sets the learning rate from here
        on (``SWA``'s annealing); with ``from_epoch`` after the run's ``epoch`` now, from that
        epoch's start (``epoch_start``), said before the run's first batch so that the length
        check counts the steps it takes until then. Its state stays as it was, so checkpoints
        keep it so and a resumed run holds it again at the same point."""
        if from_epoch is not None and from_epoch > epoch:
            self.held_from = from_epoch if self.held_from is None else min(self.held_from, from_epoch)
            return
        self.per_batch = self.per_epoch = self.counted = False
        self.held = True

    def lightning_order(self) -> None:
        """Step an epoch interval's scheduler (a plateau's aside) where Lightning's ``Trainer``
        steps it: after the epoch's last update, before that batch's ``on_train_batch_end``, the
        validation and ``on_train_epoch_end`` (which then read the next epoch's rate, as there),
        and not after an epoch that ``max_steps`` or a stop cut short; a plateau still after the
        epoch-end hooks, on what they log."""
        self.at_last_update = True

    def after_last_update(self, updates: int, rates: Callable[[], Dict[str, float]]) -> None:
        """The epoch's last batch was trained, the run's ``updates``-th: in Lightning's order,
        ``rates()`` (what the epoch trained at) kept for its row, and the scheduler stepped."""
        if self.at_last_update and self.per_epoch and not self.plateau and not self.counted:
            self.trained_rates = rates()
            self._step(updates=updates)

    def epoch_start(self, epoch: int) -> None:
        """An epoch starts: from ``held_from`` on, held."""
        self.trained_rates = None
        if self.held_from is not None and epoch >= self.held_from and not self.held:
            self.hold()

    def stepped_by(self, hook: Callable[..., None]) -> None:
        """Step every scheduler by ``hook(scheduler, metric, updates)`` (Lightning's
        ``lr_scheduler_step``: a timm scheduler's ``step(epoch=...)`` written there), at the
        configured interval only, ``metric`` the plateau's figure, else None (as Lightning passes
        it), ``updates`` the run's after a batch (None at an epoch's end)."""
        if self.scheduler is None or self.held:
            return
        self.hook, self.counted = hook, False
        self.per_batch, self.per_epoch = self.interval == "batch", self.interval == "epoch"

    def _step(self, *figure: Any, updates: Optional[int] = None) -> None:
        if self.hook is None:
            self.scheduler.step(*figure)
            return
        for scheduler in self._each():
            self.hook(scheduler, figure[0] if figure else None, updates)

    def after_batch(self, updates: int) -> None:
        """An update was made (not a skipped batch): the run's ``updates``-th batch."""
        if self.counted:
            self.scheduler.step_update(updates)
        elif self.per_batch and not self.plateau:
            self._step(updates=updates)

    def after_step_evaluation(self, row: Dict[str, Any]) -> bool:
        """An ``eval_every_n_steps`` evaluation's row; whether the scheduler stepped on it."""
        if self.per_batch and self.plateau:
            self._step(self.figure(row))
            return True
        return False

    def after_epoch(self, row: Dict[str, Any], evaluated: bool, has_eval_set: bool) -> None:
        """The epoch's row (``evaluated``: it holds the evaluation's figures): a plateau on an
        evaluation figure passes over the epochs not evaluated."""
        if not self.per_epoch:
            return
        if self.counted:        # (timm's plateau kind decides on a metric: the row's figure)
            self.scheduler.step(row["epoch"], self.figure(row))
        elif not self.plateau:
            if not self.at_last_update:     # (Lightning's order: stepped after the last update, if at all)
                self._step()
        elif evaluated or not has_eval_set or not (self.monitor or "test_loss").startswith("test_"):
            self._step(self.figure(row))       # (a training figure: every epoch)
