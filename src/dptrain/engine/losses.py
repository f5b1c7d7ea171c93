"""The user's loss, turned into shard sums and a denominator, so shards combine exactly.

One device on a global batch of N samples computes ``loss(model(X), y)``: with a ``mean``
reduction that is ``sum of per-sample losses / N`` (or a weighted count, for cross-entropy
with class weights or ignored targets), with ``sum`` it is the sum. Split over devices and
processes, each shard computes its *sum*, the sums are added in the gradients, and the
total is divided once by the global denominator: never a mean of means, never a second
division. ``LossAdapter`` knows how each torch loss defines its mean:

- ``nn.CrossEntropyLoss``/``NLLLoss`` (and ``F.cross_entropy``/``F.nll_loss``): the shard
  sum, over the targets that are not ``ignore_index``, weighted by ``weight[target]``;
  with class probabilities as targets, over positions;
- elementwise losses (``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``, ``BCELoss``,
  ``BCEWithLogitsLoss``, ``SoftMarginLoss``): over elements;
- ``KLDivLoss``: over elements, or samples with ``reduction="batchmean"``;
- any other callable: ``reduction="mean"`` (PyTorch's default) is a mean over the shard's
  samples, ``"sum"`` a sum; a ``step`` function may return ``(sum, count)`` to be exact
  whatever it computes.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import torch
from torch import nn

from ..data.batch import batch_size
from .class_weights import ClassWeights
from .class_counts import KeptTargets, LazyCount, class_count, none_ignored
from .loss_checks import (check_class_targets, check_classification, classes_last, check_float_targets, check_reduction,
                          check_same_shape, trains_on_integers)
from .loss_placement import LossCopies, summed_twin, unreduced_twin
from .model_outputs import output_for
from .own_loss import next_token
from .loss_kinds import (CLASSIFICATION, ELEMENTWISE, FLOAT_TARGETS, REDUCTIONS, WEIGHABLE, as_module, batch_taken,
                         samples_of, takes_batch)
from .sample_weights import check_weighable, weighted_sum
from .whole_batch import WholeBatch

Count = Union[int, torch.Tensor, None]      # None: a sum reduction, nothing to divide by


class LossAdapter:
    """``adapter(output, target) -> shard sum``; ``adapter.count(target)`` -> its denominator.

    >>> adapter = LossAdapter(nn.MSELoss())
    >>> s = adapter(out_shard, y_shard)          # sum of squared errors of the shard
    >>> n = adapter.count(y_shard)               # its number of elements
    >>> # N shards: sum(s_i) / sum(n_i) == nn.MSELoss()(out, y) on the whole batch
    """

    def __init__(self, loss: Optional[Callable] = None, reduction: Optional[str] = None, class_weight: Any = None,
                 sample_weighted: bool = False):
        loss = nn.CrossEntropyLoss() if loss is None else loss
        loss = as_module(loss)
        if not callable(loss):
            raise TypeError(f"loss must be callable as loss(output, target), got {type(loss).__name__}")
        own = getattr(loss, "reduction", None) if isinstance(loss, nn.Module) else None
        if own is not None and reduction is not None and reduction != own:
            raise ValueError(f"reduction={reduction!r} contradicts the loss's own reduction {own!r}: set it on "
                             f"the loss, e.g. nn.MSELoss(reduction={reduction!r})")
        self.reduction = own or reduction or "mean"
        self.declared = own is not None or reduction is not None
        self._reduction_checked = False
        if self.reduction not in REDUCTIONS + ("batchmean",) or (self.reduction == "batchmean"
                                                                 and not isinstance(loss, nn.KLDivLoss)):
            raise ValueError(f"loss reduction {self.reduction!r} cannot be split over devices: use 'mean' or 'sum' "
                             f"(per-sample losses with reduction='none' must be reduced)")
        self.loss = loss
        self.classification = isinstance(loss, CLASSIFICATION)
        self.elementwise = isinstance(loss, ELEMENTWISE)
        self.float_targets = isinstance(loss, FLOAT_TARGETS)
        self.known = isinstance(loss, CLASSIFICATION + ELEMENTWISE + (nn.KLDivLoss,))
        if self.known:      # the same loss, reduced by summation: exact shard sums
            self._sum = summed_twin(loss)
        self._checked = False
        #: A loss module holding tensors (class weights, ``pos_weight``): on each device it meets
        #: (``loss_placement.py``); None: nothing to place.
        self._placed = LossCopies(loss, getattr(self, "_sum", None)) if LossCopies.needed(loss) else None
        self._kept: Optional[KeptTargets] = None
        self.takes_batch = not self.known and takes_batch(loss)
        #: ``whole_batch(fn)``: its value on the whole batch, as ``(sum, count)`` (``whole_batch.py``).
        self.whole_batch = isinstance(loss, WholeBatch)
        #: The parts a batch is cut into (devices times processes; ``ModelEngine`` sets it): a loss
        #: coupling samples on several is an error naming ``whole_batch`` (``check_reduction``).
        self.parts = 1
        #: Whether the loss returns ``(sum, count)`` (None: not known before its first call).
        self.pairs: Optional[bool] = False if self.known else None
        #: A classification loss fed a model output's logits (``output_for`` sets it), and whether
        #: they hold the classes last, ``(N, T, C)`` for ``(N, T)`` labels, as Hugging Face's token
        #: classifiers give them: moved to dimension 1 for the loss and the accuracy (set at the
        #: first check); the metrics get them as the model gave them.
        self.from_model_output = False
        self.classes_last = False
        #: A causal language model's labels, read shifted by one (``own_loss.check_own_loss`` sets
        #: it): the loss, its count and the accuracy compare ``logits[:, t]`` with ``labels[:, t + 1]``.
        self.shift_labels = False
        #: Keras's ``class_weight``, weighing the training loss only (``measure``, ``whole``): an
        #: evaluation's (``__call__``) is the plain loss, as Keras's validation loss is.
        self.class_weights = None if class_weight is None else ClassWeights(class_weight, loss)
        if sample_weighted:     # Keras's sample_weight: its weights come with each training shard
            check_weighable(loss, WEIGHABLE)
        self._unreduced: Optional[Tuple[Any, Any]] = None      # (the loss, its reduction="none" view)
        #: Every training target counts in the mean (``count_from``): ``whole``'s count is their number.
        self.all_counted = False

    def count_from(self, targets: Any) -> None:
        """Read the training set's whole target column (tensors in memory) once: if the loss's
        mean counts each of them (``class_counts.none_ignored``), ``whole``'s count is then a
        batch's targets' number, with no tensor operation a step."""
        self.all_counted = self.known and self.classification and self.reduction == "mean" and \
            self.class_weights is None and none_ignored(self.loss, self.read_target(targets))

    def read_target(self, target: Any) -> Any:
        """``target`` as the loss reads it: a causal LM's labels shifted (``shift_labels``)."""
        return next_token(target) if self.shift_labels else target

    # -- per shard ---------------------------------------------------------------------
    def measure(self, output: Any, target: Any, batch: Any = None, count: bool = True,
                weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Count]:
        """The shard's sum and denominator (None: a sum; not computed unless ``count``, or
        the loss's own second value when it returns ``(sum, count)``); ``weights``: its
        samples' (Keras's ``sample_weight``), each one's loss times its weight."""
        output, target = output_for(self, output), self.read_target(target)
        if self.class_weights is not None or weights is not None:
            return self._weighed(output, target, weights), self._count(target, output) if count else None
        value = self._value(output, target, batch)
        if isinstance(value, tuple):
            return value
        return value, self._count(target, output) if count else None

    def __call__(self, output: torch.Tensor, target: Any, batch: Any = None) -> Any:
        """The shard's sum (the loss itself with a sum reduction); ``(sum, count)`` from a
        loss that returns them."""
        return self._value(output, self.read_target(target), batch)

    def _value(self, output: torch.Tensor, target: Any, batch: Any = None) -> Any:
        if self.known:
            output = self._check(output, target)
            return (self._sum if self._placed is None else self._placed.on(output)[1])(output, target)
        value = self._own(output, target, batch)
        if isinstance(value, tuple):
            return value
        return value * samples_of(target, output) if self.reduction == "mean" else value

    def whole(self, output: Any, target: Any, batch: Any = None,
              weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Count]:
        """The loss as one device on the whole batch computes it (the plain loop's value, to
        run backward on: a mean, or a sum with a sum reduction), and its denominator (None for
        a sum). The same gradient as ``measure``'s sum divided by its count, without the
        multiplications: what one device of one process runs (``direct_step.py``); ``weights``
        as ``measure``'s."""
        output, target = output_for(self, output), self.read_target(target)
        if self.class_weights is not None or weights is not None:
            value, count = self._weighed(output, target, weights), self._count(target, output)
            return (value, None) if count is None else (value / count, count)
        if self.known:
            output = self._check(output, target)
            loss = self.loss if self._placed is None else self._placed.on(output)[0]
            return loss(output, target), target.numel() if self.all_counted else self._lazy_count(target)
        value = self._own(output, target, batch)
        if isinstance(value, tuple):
            return value[0] / value[1], value[1]
        return value, samples_of(target, output) if self.reduction == "mean" else None

    def weighed(self, output: torch.Tensor, target: Any, weights: torch.Tensor) -> torch.Tensor:
        """The shard's sum, each sample's loss times its weight (an evaluation's, Keras's
        ``evaluate(..., sample_weight=w)``; ``output`` as ``output_for`` gives it)."""
        return self._weighed(output, self.read_target(target), weights)

    def _weighed(self, output: torch.Tensor, target: Any, weights: Optional[torch.Tensor]) -> torch.Tensor:
        """The training shard's sum weighed by ``class_weight`` (``class_weights.py``), by its
        samples' ``weights`` (``sample_weights.py``), or by both (their product, as Keras's)."""
        output = self._check(output, target)
        loss = self.loss if self._placed is None else self._placed.on(output)[0]
        if weights is None:
            return self.class_weights.weighted_sum(loss, output, target)
        unreduced = self._unreduced
        if unreduced is None or unreduced[0] is not loss:       # (a view of the loss: made once a loss)
            unreduced = self._unreduced = (loss, unreduced_twin(loss))
        per = unreduced[1](output, target)
        if self.class_weights is not None:
            per = per * self.class_weights.of_elements(output, target)
        return weighted_sum(per, weights)

    def _check(self, output: torch.Tensor, target: Any) -> torch.Tensor:
        """``output`` checked against ``target`` (a classification's at the first batch), as the
        loss takes it: a model output's classes-last logits moved to dimension 1."""
        if self.classification and not self._checked:
            self.classes_last = self.from_model_output and classes_last(output, target)
            check_classification(output.movedim(-1, 1) if self.classes_last else output, target, self.loss)
            self._checked = True
        if self.classes_last:
            return output.movedim(-1, 1)
        if self.elementwise and isinstance(target, torch.Tensor):
            if output.shape != target.shape:
                check_same_shape(output, target, self.loss)
            if not target.is_floating_point() and (self.float_targets or not trains_on_integers(type(self.loss))):
                check_float_targets(target, self.loss)
        return output

    def _own(self, output: Any, target: Any, batch: Any) -> Any:
        """A loss dptrain does not know: its value (one number), or its ``(sum, count)``."""
        loss = self.loss if self._placed is None else self._placed.on(output)[0]
        value = loss(output, target, batch) if self.takes_batch else loss(output, target)
        if isinstance(value, (tuple, list)) and len(value) == 2:      # (sum, count): exact by itself
            self.pairs = True
            return value[0].reshape(()), value[1]
        self.pairs = self.whole_batch       # (a whole_batch loss alone: its count is its samples)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"the loss returned {shape}, not one number: reduce it with 'mean' or 'sum', or "
                             f"return (sum, count)")
        value = value.reshape(())
        if self.whole_batch:
            n = batch_size((output, target))
            return value * n, n
        if not self._reduction_checked:
            if self.takes_batch:        # (the batch's halves beside the outputs' and targets')
                self._reduction_checked = check_reduction(batch_taken(self.loss), self.reduction, self.declared,
                                                          output, (target, batch), value, self.parts)
            else:
                self._reduction_checked = check_reduction(self.loss, self.reduction, self.declared, output, target,
                                                          value, self.parts)
        return value

    def lazy_count(self, target: Any, output: Any = None) -> Any:
        """``count``, as a ``LazyCount`` (computed later, for many batches at once) where it
        takes tensor operations: cross-entropy's mean over integer targets."""
        return self._lazy_count(self.read_target(target), output)

    def _lazy_count(self, target: Any, output: Any = None) -> Any:
        if self.classification and not self._checked:
            check_class_targets(target, self.loss)      # (before the forward: its count is taken now)
        if self.known and self.classification and self.reduction == "mean" and not target.is_floating_point():
            return LazyCount(target, self.loss)
        return self._count(target, output)

    def count(self, target: Any, output: Any = None) -> Count:
        """The denominator of a batch of ``target``s (a shard or a process's whole batch;
        ``output``: its samples where the target is None)."""
        return self._count(self.read_target(target), output)

    def _count(self, target: Any, output: Any = None) -> Count:
        if self.reduction == "sum":
            return None
        if not self.known or self.reduction == "batchmean":
            return samples_of(target, output)
        if self.classification and not self._checked:
            check_class_targets(target, self.loss)
        if self.classification and not target.is_floating_point():
            return class_count(target, self.loss)
        if self.classification:                   # class probabilities: a mean over positions
            return target.numel() // target.shape[1]
        return target.numel()

    def counts_numbers(self) -> bool:
        """Whether a batch's denominator counted after the forward is a number (None: a sum)."""
        return self.pairs is not False or self.reduction != "sum"

    def per_sample(self, target: Any) -> float:
        """What the mean counts per sample of ``target``: its elements for a torch element-wise
        mean (``MSELoss``, ``KLDivLoss``), else 1 (samples; cross-entropy's weighted or kept
        targets are known only after the forward, and 1 is their usual count)."""
        if not self.known or self.classification or self.reduction != "mean" or not isinstance(target, torch.Tensor) \
                or target.dim() == 0 or target.shape[0] == 0:
            return 1.0
        return target.numel() / target.shape[0]

    def correct(self, output: torch.Tensor, target: Any) -> Optional[Tuple[torch.Tensor, Count]]:
        """``(correct, count)`` of the arg-max predictions, for classification losses (against
        the arg-max class of probability targets, as Keras's categorical accuracy)."""
        if not self.classification:
            return None
        target = self.read_target(target)
        if self.classes_last:       # (set by the loss's check, which runs first)
            output = output.movedim(-1, 1)
        if target.is_floating_point():
            hits = output.argmax(dim=1) == target.argmax(dim=1)
            return hits.sum(), hits.numel()
        hits = output.argmax(dim=1) == target
        kept = self._kept
        if kept is None or kept.ignore_index != getattr(self.loss, "ignore_index", -100):
            kept = self._kept = KeptTargets(getattr(self.loss, "ignore_index", -100))
        if kept.ignore_index >= 0:      # (a negative one is never an arg-max: never a hit)
            hits &= target != kept.ignore_index
        # The count is computed later, for many batches at once: 3 operations a batch, as a
        # plain loop's accuracy takes (6 took 12 us a batch of 64 here, 3 take 7).
        return hits.sum(), LazyCount(target, kept)


def host_number(count: Count) -> Count:
    # A count computed on the host is a plain number: sending a CPU tensor into a GPU bucket
    # would wait for the GPU.
    if isinstance(count, torch.Tensor) and count.device.type == "cpu":
        value = count.item()
        return int(value) if float(value).is_integer() else value
    return count


def add_counts(a: Count, b: Count) -> Count:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device != b.device:
        b = b.to(a.device, non_blocking=True)
    return a + b
