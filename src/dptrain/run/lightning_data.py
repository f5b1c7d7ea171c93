"""A ``LightningDataModule`` as ``fit``'s data, and a ``LightningModule``'s own loaders, taken
as Lightning's ``Trainer`` takes them (``trainer.fit(model, datamodule=dm)``, ``trainer.fit(model)``):

    dptrain.fit(lit_model, dm, epochs=10)        # dm.train_dataloader(), dm.val_dataloader()
    dptrain.fit(lit_model, epochs=10)            # lit_model.train_dataloader(), its val_dataloader()

In Lightning's order: ``prepare_data()`` (a download) in one process of each machine while the
others wait (in one of the whole job with ``prepare_data_per_node = False``;
``distributed/once.py``), ``setup("fit")`` in every process, the loaders, and after the run,
however it ends, ``teardown("fit")``: the data module's, then the module's (a module's hooks
only where it is taken as a LightningModule, ``lightning_adopt.adopted``). Loaders given to
``fit`` come first: ``fit(lit_model, train_loader)`` takes only the module's
``val_dataloader()``. A loader's ``batch_size`` is the global batch, as for every loader
given to ``fit``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..distributed.once import once_per_machine
from ..engine.lightning_adopt import adopted
from ..engine.lightning_module import explain_trainer, overridden
from .config import TrainConfig
from .session import join_before_run


#: A data module's hooks ``fit`` does not call (a line names those it overrides).
NOT_CALLED = ("transfer_batch_to_device",)


def is_data_module(data: Any) -> bool:
    """A ``LightningDataModule`` (or its shape: an object with ``train_dataloader()``)."""
    return callable(getattr(data, "train_dataloader", None)) \
        and not isinstance(data, (nn.Module, DataLoader, Dataset))


def _own(obj: Any, hooks: Sequence[str]) -> List[str]:
    """The ``hooks`` the object defines itself (not Lightning's do-nothing or raising ones)."""
    return [h for h in overridden(obj, hooks) if callable(getattr(obj, h, None))]


def _one_loader(loaders: Any, owner: str, method: str = "val_dataloader") -> Any:
    """``val_dataloader()``'s return (or ``method``'s): a loader, or a list holding one (an
    empty one: none)."""
    if isinstance(loaders, (list, tuple)) and not isinstance(loaders, DataLoader):
        if len(loaders) > 1:
            raise ValueError(f"{owner}.{method}() returned {len(loaders)} loaders, which its step would tell apart "
                             f"by its dataloader_idx: give fit eval_data={{'val': loader, 'ood': other}} (a name "
                             f"each: test_*, test_ood_*; evaluate takes such a dict too) and a step of two arguments")
        return loaders[0] if loaders else None
    return loaders


def _call(obj: Any, name: str, *args: Any) -> Any:
    """``obj.<name>(*args)``: Lightning's "not attached to a `Trainer`" error told why and the fix."""
    try:
        return getattr(obj, name)(*args)
    except RuntimeError as e:
        explain_trainer(e, name, "give the loaders yourself (fit(model, train_loader, val_loader))")
        raise


def _prepare(obj: Any, alone: bool = False) -> None:
    """``obj.prepare_data()``, if it has its own: in one process of each machine (of the job with
    ``prepare_data_per_node = False``) while the others wait; here with ``alone``."""
    if not _own(obj, ["prepare_data"]):
        return
    if alone:
        _call(obj, "prepare_data")
        return
    once_per_machine(lambda: _call(obj, "prepare_data"), getattr(obj, "prepare_data_per_node", True) is not False,
                     f"{type(obj).__name__}.prepare_data()")


class LightningData:
    """What the data module and the module give ``fit``, and their hooks around the run."""

    def __init__(self, model: nn.Module, train_data: Any, eval_data: Any, what: Dict[str, Any]):
        self.module = model if adopted(model, what) else None
        self.data_module = train_data if is_data_module(train_data) else None
        self.train_data, self.eval_data = train_data, eval_data
        self.holders = [o for o in (self.data_module, self.module) if o is not None]
        self.set_up: List[Any] = []
        if train_data is None and (self.module is None or not _own(self.module, ["train_dataloader"])):
            raise TypeError("fit() needs train_data: fit(model, (X, y)), a Dataset, a DataLoader, or a "
                            "LightningDataModule; with none, a LightningModule's own train_dataloader() (none is "
                            "defined here)")

    @property
    def used(self) -> bool:
        """Whether anything here is Lightning's to call."""
        return bool(self.holders)

    def take(self, config: TrainConfig) -> Tuple[Any, Any, List[str]]:
        """Prepare and set up; return ``(train_data, eval_data)`` and a line naming the loaders taken."""
        if any(_own(o, ["prepare_data"]) for o in self.holders):
            join_before_run(config)         # (the others wait for the process preparing)
        for obj in self.holders:
            _prepare(obj)
        for obj in self.holders:
            if _own(obj, ["setup"]):
                _call(obj, "setup", "fit")
            self.set_up.append(obj)
        train, evaluation, taken = self.train_data, self.eval_data, []
        if train is None or self.data_module is not None:
            source = self.data_module if self.data_module is not None else self.module
            train = _call(source, "train_dataloader")
            taken.append(f"{type(source).__name__}.train_dataloader()")
        if evaluation is None:
            source = next((o for o in (self.data_module, self.module)
                           if o is not None and _own(o, ["val_dataloader"])), None)
            if source is not None:
                evaluation = _one_loader(_call(source, "val_dataloader"), type(source).__name__)
                taken.append(f"{type(source).__name__}.val_dataloader()")
        notes = [f"the data is {' and '.join(taken)}, as Lightning's Trainer takes it (prepare_data() once per "
                 f"machine, setup('fit') in every process)"] if taken else []
        skipped = _own(self.data_module, NOT_CALLED) if self.data_module is not None else []
        if skipped:         # (its on_before/after_batch_transfer are called: engine/lightning_transfer.py)
            notes.append(f"the data module's {', '.join(skipped)} (Lightning hooks) are not called: fit moves "
                         f"each device's part itself; change the batch in on_before_batch_transfer, or on its device "
                         f"in on_after_batch_transfer")
        return train, evaluation, notes

    def teardown(self) -> None:
        """``teardown("fit")`` of what was set up, as the run ends however it ends."""
        for obj in self.set_up:
            if _own(obj, ["teardown"]):
                _call(obj, "teardown", "fit")
        self.set_up = []


#: The loader ``evaluate`` (Lightning's ``trainer.test``) and ``predict`` take from a data module,
#: by the stage its ``setup`` is told: the first it has.
STAGE_LOADERS = {"test": ("test_dataloader", "val_dataloader"), "predict": ("predict_dataloader",)}


@contextmanager
def stage_data(data: Any, stage: str, alone: bool) -> Iterator[Any]:
    """``data``, or a data module's loader for ``stage`` (``STAGE_LOADERS``): ``prepare_data()``
    once per machine while the other processes wait (here alone with ``alone``: the others do
    not come), ``setup(stage)``, and ``teardown(stage)`` after the block."""
    if not is_data_module(data):
        yield data
        return
    name = next((n for n in STAGE_LOADERS[stage] if _own(data, [n])), None)
    if name is None:
        raise TypeError(f"the {type(data).__name__} (a LightningDataModule) has no {' or '.join(STAGE_LOADERS[stage])}"
                        f" of its own: define one, or give the loader itself")
    _prepare(data, alone)
    if _own(data, ["setup"]):
        _call(data, "setup", stage)
    try:
        yield _one_loader(_call(data, name), type(data).__name__, name)
    finally:
        if _own(data, ["teardown"]):
            _call(data, "teardown", stage)


def data_of(model: nn.Module, train_data: Any, eval_data: Any, what: Dict[str, Any]) -> Optional[LightningData]:
    """The Lightning data of a ``fit`` call (a data module, a module's own loaders, a module's
    hooks), or None where there is nothing of Lightning's to call."""
    data = LightningData(model, train_data, eval_data, what)
    return data if data.used else None
