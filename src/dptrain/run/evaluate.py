"""``dptrain.evaluate``: a model's loss, accuracy and metrics over a whole data set, computed
on every device and process (Keras's ``model.evaluate``, Lightning's ``trainer.test``).

The figures are those a ``fit`` epoch row gives for its ``eval_data``, by the same code
(``engine/evaluation.py``, ``report.test_figures``): sums over every device and process
divided once, metric objects over the whole set. So they do not depend on how many devices
or processes computed them, and equal ``fit``'s last ``test_*`` figures on the same data.

    figures = dptrain.evaluate(model, test_set)          # {"test_loss": 0.31, "test_acc": 0.89}
    dptrain.evaluate(model, (X, y), loss=nn.MSELoss(), metrics={"mae": mae})
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ..core.modes import evaluating
from ..core.stage import stage
from ..data.choose_loader import lists_as_columns, make_loader, reading_batch_size
from ..data.sample_weights import weighed, weights_for
from ..distributed.env import DEFAULT_TIMEOUT_S
from ..engine.lightning_adopt import staged, steps_of
from ..engine.lightning_module import LightningSteps
from ..engine.lightning_test_hooks import with_test_hooks
from ..engine.metric_names import metrics_copied
from ..engine.model_engine import ModelEngine
from ..parallel.given_model import unwrapped
from ..engine.task import Task
from .config import AMP_DTYPES
from .build import evaluation_sets
from .float64_data import float64_named
from .flag_words import keyword_errors
from .keywords import EVALUATE_PEERS, keywords_checked
from .report import figures_over, other_sets
from .lightning_data import is_data_module, stage_data
from .session import ALL_CALL, inference_job


@keyword_errors
@keywords_checked(EVALUATE_PEERS)
def evaluate(model: nn.Module, data: Any, *, loss: Union[None, str, Callable] = None, reduction: Optional[str] = None,
             forward: Optional[Callable] = None, step: Union[None, Callable, Dict[str, Callable]] = None,
             metrics: Union[None, Mapping[str, Any], Sequence[str]] = None, batch_size: Optional[int] = None,
             devices: Union[str, int, Sequence[Any]] = "auto", collate_fn: Optional[Callable] = None,
             num_workers: int = 0, amp: Optional[str] = None, dispatch_batches: bool = False,
             sharded_stream: bool = False, local: bool = False, sample_weight: Any = None,
             timeout: float = DEFAULT_TIMEOUT_S) -> Dict[str, Any]:
    """Return ``model``'s figures over every sample of ``data``: ``test_loss``, ``test_acc``
    (classification losses) and ``test_<name>`` for each metric, as ``fit``'s rows name them
    (several sets, ``{"val": ..., "ood": ...}``: the others' as ``test_<set>_*``, as ``fit``'s;
    ``step={name: fn}``, a GAN's steps: each one's ``test_<name>_loss``, ``test_loss`` their sum).

    ``data``, ``loss``, ``reduction``, ``forward``, ``step``, ``metrics``, ``collate_fn`` and
    ``num_workers`` are what ``fit`` takes (a LightningModule with none of ``loss``, ``forward``
    and ``step``: its ``test_step`` evaluates, as Lightning's ``trainer.test``, else its
    ``validation_step``, what it gives ``self.log`` the figures: ``test_acc``); ``batch_size``
    is global (default: a ``DataLoader``'s own, else 256); ``amp``: ``"bf16"`` or ``"fp16"``; ``devices`` as ``predict``'s (``auto``: every
    GPU, else one CPU device). In eval mode, without gradients; the model's mode is restored. With several
    processes (``WORLD_SIZE`` > 1) each evaluates its part and every one gets the figures;
    their models must hold the same weights (as after ``fit``), which is checked.
    A stream (an ``IterableDataset``) is read whole by every process; ``dispatch_batches``: by
    rank 0 alone, which sends the others their parts; ``sharded_stream``: each process's
    stream is its own share of the set, read to its end (as ``fit``'s). ``local=True``: this
    process alone scores every sample, with no other process (a script's ``if rank == 0:``).
    ``sample_weight``: Keras's, one weight a sample of ``data`` (or ``True``: its batches carry
    them last), as ``fit``'s: ``test_loss`` is each sample's loss times its weight over the
    samples; the accuracy and metrics are unweighted (Keras weighs only its ``weighted_metrics``).

    >>> dptrain.evaluate(model, (X, y), devices=2)     # half of each batch on cpu:0, half on cpu:1
    {'test_loss': 0.412, 'test_acc': 0.861}
    """
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be 'bf16', 'fp16' or None, got {amp!r}")
    env, devices, collective = inference_job(devices, timeout, dispatch_batches, sharded_stream, local)
    # A LightningDataModule's data (Lightning's trainer.test); float64 arrays named in a dtype error.
    data = lists_as_columns(data)       # ((X, labels_list): a list column made a tensor)
    module_data = data if is_data_module(data) else None     # (its on_after_batch_transfer: staged)
    with float64_named(model, data), stage_data(data, "test", local) as data, contextlib.ExitStack() as stack:
        # A LightningModule's own steps: its test_step evaluates (Lightning's trainer.test), else validation_step.
        step = steps_of(model, {"step": step, "loss": loss, "forward": forward}, testing=True) or step
        stack.enter_context(staged(model, "test", step if isinstance(step, LightningSteps) else None, module_data))
        task = Task(model, data, loss=loss, reduction=reduction, forward=forward, step=step,
                    optimizer=None if isinstance(step, dict) else "sgd",       # (a dict of steps: each scores)
                    metrics=metrics_copied(metrics),
                    collate_fn=collate_fn, name="evaluate", sample_weight=sample_weight)
        sets = evaluation_sets(data, task.metrics)
        if sample_weight is not None and len(sets) > 1:
            raise ValueError(f"sample_weight weighs one set's samples, and the data holds {len(sets)} sets "
                             f"({', '.join(sets)}): evaluate each set on its own, with its weights")
        collates = {}
        for name, one in sets.items():      # (Keras's sample_weight: the batches made to carry them)
            sets[name], collates[name] = weighed(one, weights_for(one, sample_weight), collate_fn)
        loaders = {name: make_loader(one, reading_batch_size(one, batch_size), num_workers=num_workers,
                                     collate_fn=collates[name], rank=env.rank,
                                     world_size=env.world_size, optional_workers=len(sets) > 1,   # (workers: for some)
                                     dispatch=dispatch_batches, sharded=sharded_stream, to_the_end=True)
                   for name, one in sets.items()}
        for loader in loaders.values():
            loader.weighs = sample_weight is not None       # (its batches carry the weights last: evaluation.py)
        first = next(iter(loaders.values()))
        try:
            with evaluating(model):         # and each module's own mode back after
                engine = ModelEngine(task, devices, amp=AMP_DTYPES[amp], training=False)
                engine.stateful.alone = local          # torchmetrics would gather from the others
                example = first.example()
                if isinstance(task.step, LightningSteps):       # (its on_before_batch_transfer)
                    example = task.step.loaded(example, task.step.eval_stage)
                # Lazy layers learn their shapes; a LightningModule's test_step names its figures.
                engine.prepare(example, eval_example=example if isinstance(task.step, LightningSteps) else None)
                with stage(ALL_CALL.format("evaluating", "evaluate")):
                    if env.distributed:
                        same_weights(collective, engine.replicas[0])
                    def figures() -> Dict[str, Any]:
                        return {**figures_over(engine, first, collective),
                                **other_sets(engine, dict(list(loaders.items())[1:]), collective)}
                    if not isinstance(task.step, LightningSteps):
                        return figures()
                    # (its on_test_start ... on_test_epoch_end ... on_test_end, around the batches)
                    return with_test_hooks(unwrapped(model), task.step, engine, collective, local, figures)
        finally:
            for loader in loaders.values():
                if hasattr(loader, "close"):
                    loader.close()


def same_weights(collective: Any, model: nn.Module) -> None:
    """Refuse models that differ between processes: their figures would mix two models."""
    with torch.no_grad():
        digest = torch.stack([t.detach().double().sum() for t in model.state_dict().values()
                              if t.is_floating_point()] or [torch.zeros((), dtype=torch.float64)]).cpu()
    sums = collective.all_gather(digest)
    differ = [r for r, s in enumerate(sums) if not torch.equal(s, sums[0])]
    if differ:
        raise ValueError(f"the model's weights differ between processes (rank {differ[0]}'s from rank 0's): "
                         f"load the same weights in every process (as fit leaves them) before evaluate")
