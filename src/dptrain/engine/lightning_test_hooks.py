"""``dptrain.evaluate`` of a LightningModule: its own hooks of the test run, where Lightning's
``trainer.test`` calls them (``trainer.validate``'s, for a module evaluated by its
``validation_step``):

    def test_step(self, batch, batch_idx):
        self.scores.append(self(batch[0]).softmax(1)[:, 1]); self.labels.append(batch[1])

    def on_test_epoch_end(self):
        self.log("test_auc", auroc(torch.cat(self.scores), torch.cat(self.labels), "binary"))
        self.scores.clear(); self.labels.clear()

``on_test_start`` and ``on_test_epoch_start`` before the first batch, ``on_test_epoch_end``
after the last, ``on_test_end`` then; once a process, on the module, its trainer ``testing``
(a stand-in while ``evaluate`` runs, if it has none). What ``on_test_epoch_end`` logs is among
``evaluate``'s figures (``test_auc``), over what every device's copy of the module kept, put
together first in the batches' order (``kept_outputs.py``, as ``fit`` does before
``on_validation_epoch_end``); with several processes, the mean of theirs, each over its part (as
``fit``'s epoch-end hooks, and Lightning's DDP with ``sync_dist=True``). The trainer's
``callback_metrics`` hold the steps' figures when it runs, by their logged names.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
from torch import nn

from .kept_outputs import KeptOutputs
from .lightning_log import PREFIXES, TEST_PREFIXES, hook_logged, processes_mean

#: The hooks' stage, by the step that evaluates.
STAGES = {"test_step": "test", "validation_step": "validation"}


def test_hook_names(evaluation: str) -> List[str]:
    """The start, epoch start, epoch end and end hooks around ``evaluation``'s batches."""
    stage = STAGES[evaluation]
    return [f"on_{stage}_{point}" for point in ("start", "epoch_start", "epoch_end", "end")]


def with_test_hooks(model: nn.Module, steps: Any, engine: Any, collective: Any, alone: bool,
                    evaluate: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """``evaluate()`` (the figures over the set) between the module's own hooks of the test run
    (see the module docstring); the figures, and what its epoch-end hook logged."""
    from .lightning_module import overridden        # (lightning_module makes its steps with this)
    start, epoch_start, epoch_end, end = names = test_hook_names(steps.evaluation)
    own = set(overridden(model, names))
    if not own:
        return evaluate()
    for hook in (start, epoch_start):
        if hook in own:
            getattr(model, hook)()
    if epoch_end in own and len(engine.devices) > 1:        # (what each device's copy keeps, put together)
        steps.kept = KeptOutputs(engine.replicas, engine.devices[0])
        steps.kept.evaluating()
    try:
        figures = evaluate()
        logged: Dict[str, float] = {}
        if epoch_end in own:
            if steps.kept is not None:
                steps.kept.gather(set(steps.validated.paths.values()))
            if steps.clock is not None:         # (what the hook reads: the steps' figures, by their logged names)
                steps.clock.callback_metrics.update({
                    name: torch.tensor(float(figures["test_" + figure]))
                    for name, figure in steps.validated.logged_as().items() if "test_" + figure in figures})
            recording = hook_logged(model, epoch_end, TEST_PREFIXES + PREFIXES, getattr(model, epoch_end))
            logged = {"test_" + name: float(value) for name, (value, _) in recording.figures.items()}
            if collective.world_size > 1 and not alone:     # (each process's, over its part: their mean)
                logged = processes_mean(collective, logged)
        if end in own:
            getattr(model, end)()
    finally:
        steps.kept = None
    return {**figures, **logged}
