"""What a ``LightningModule``'s hooks of each batch (``on_train_batch_end``,
``on_before_optimizer_step``...: ``lightning_batch_hooks.py``) give ``self.log``, put where
Lightning puts it, with Lightning's defaults for those hooks (``on_step=True, on_epoch=False``):

    self.log_dict(grad_norm(self, norm_type=2))     # in on_before_optimizer_step: each step row
    self.log("ema_gap", gap, on_epoch=True)         # ... and the epoch's mean: train_ema_gap

A figure logged ``on_step`` is in the step row of that update (``log_every_n_steps=N``: rows
every N updates, as Lightning logs every 50 by default), by its logged name
(``grad_2.0_norm/net.0.weight``), as Lightning's logger gets it; one logged at other updates is
in no row (Lightning's too: it writes the step's figures at its logging steps alone). Without
step rows a line says so, once. A figure logged ``on_epoch`` is the mean over the epoch's
updates that logged it, in the epoch's row as the training's figures are (``train_<name>``;
with ``on_step`` as well, Lightning's ``_step`` and ``_epoch`` names: ``train_<name>_epoch``).
The hooks run once a process; the rows are rank 0's (what rank 0's hooks logged: every process
holds the same summed gradients). A checkpoint keeps the epoch's sums so far (rank 0's), so a
run resumed mid-epoch gives that epoch's mean as an unbroken run does.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import nn

from ..engine.lightning_log import ONE, TRAIN_PREFIXES, Recording



class BatchLogs:
    """What the module's batch hooks logged: at the update ``step`` they were called for
    (``call``), the figures of its step row; over the epoch, the sums of its ``on_epoch`` ones."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.step = -1
        self.at_step: Dict[str, float] = {}                 # the step row's figures, by row name
        self.sums: Dict[str, List[float]] = {}              # [sum, count] of the epoch's, by row name
        self._names: Dict[str, str] = {}                    # figure names by logged name (Recording's)
        self.told = False                                   # the line of step figures with no step rows: once

    def call(self, hook: str, step: int, *args: Any, fn: Optional[Callable[..., Any]] = None) -> Any:
        """Call the module's ``hook(*args)`` (or ``fn(*args)``, which calls it and a Lightning
        callback's) for update ``step``, keeping what it logs."""
        with Recording(self.module, ONE, hook, TRAIN_PREFIXES, self._names) as recording:
            out = (fn or getattr(self.module, hook))(*args)
        if recording.objects:
            raise ValueError(f"self.log of a torchmetrics object ({', '.join(map(repr, recording.objects))}) in "
                             f"the module's {hook}: log it in training_step (self.log('train_acc', self.acc)), "
                             f"where fit computes it over the epoch, every device's and process's updates merged")
        if step != self.step:
            self.step, self.at_step = step, {}
        for name, (on_step, on_epoch) in recording.options.items():
            on_step = True if on_step is None else bool(on_step)        # (Lightning's defaults in these hooks)
            value, _ = recording.figures[self._names[name]]
            value = float(value)
            if on_step:
                self.at_step[name + "_step" if on_epoch else name] = value
            if on_epoch:
                figure = "train_" + self._names[name] + ("_epoch" if on_step else "")
                total = self.sums.setdefault(figure, [0.0, 0.0])
                total[0] += value
                total[1] += 1
        return out

    def into_step_row(self, row: Dict[str, Any]) -> None:
        """Add the figures logged for the row's update; a name the row has is an error."""
        if row["step"] != self.step or not self.at_step:
            return
        clash = [name for name in self.at_step if name in row]
        if clash:
            raise ValueError(f"the module's batch hooks logged {', '.join(map(repr, clash))}, a name of the step "
                             f"row's own figures: log it under another name")
        row.update(self.at_step)

    def tell_unrowed(self, log: Callable[[str], None], hooks: Tuple[str, ...]) -> None:
        """No step rows are asked for: say once which step figures go unkept."""
        if self.told or not self.at_step:
            return
        self.told, names = True, list(self.at_step)
        log(f"dptrain: the module's {', '.join(hooks)} log {', '.join(map(repr, names[:3]))}"
            f"{' and others' if len(names) > 3 else ''} each step (Lightning's on_step), kept in step rows: give "
            f"log_every_n_steps=N for a row every N updates (Lightning's default is 50), or log with "
            f"on_epoch=True for the epoch's mean in its row")

    def into_epoch_row(self, row: Dict[str, Any]) -> None:
        """Add the epoch's means (``on_epoch``) and start the next epoch's sums."""
        row.update({name: total / count for name, (total, count) in self.sums.items() if count})
        self.sums = {}

    def state_dict(self) -> Dict[str, Any]:
        return {"sums": {name: list(total) for name, total in self.sums.items()}} if self.sums else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.sums = {name: list(total) for name, total in state.get("sums", {}).items()}
