"""Gradient accumulation as data: a loader whose items are groups of k batches, one per update.

``accumulate_grad_batches=k`` makes one optimizer step out of k consecutive batches (the
"micro-batches"): the engine runs forward and backward on each in turn, keeping only one
micro-batch's activations, and sums the gradients before one exchange and one update
(``engine.model_engine``). The update equals that of one batch k times as large, with the
memory of one. Seen from the loop, a group is a batch: a step, a position to resume at, a
moment to stop, so none of that changes.

    >>> steps = Accumulating(loader, 4)         # len(steps) == ceil(len(loader) / 4)
    >>> for group in steps.batches():           # MicroBatches([b0, b1, b2, b3]), ...
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple


class MicroBatches(list):
    """The batches (this process's parts of them) summed into one update, in order."""


def micro_batches(batch: Any, sizes: Optional[Sequence[Any]]) -> Tuple[List[Any], List[Any]]:
    """A step's batches (one, or a group's) and each one's parts over the devices (``sizes``,
    ``--balance``: a list per micro-batch for a group; None: as even as can be); a
    ``ValueError`` for an empty group, or parts not one per micro-batch."""
    micro = list(batch) if isinstance(batch, MicroBatches) else [batch]
    if not micro:
        raise ValueError("an empty group of micro-batches: nothing to step on")
    each = list(sizes) if sizes is not None and isinstance(batch, MicroBatches) else [sizes] * len(micro)
    if len(each) != len(micro):
        raise ValueError(f"{len(each)} lists of parts for a group of {len(micro)} micro-batches: give one each")
    return micro, each


class Accumulating:
    """``loader``'s batches in groups of ``k`` (the last group of an epoch may be smaller, as
    Lightning and Accelerate do). Anything else is asked of ``loader``."""

    def __init__(self, loader: Any, k: int):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"accumulate_grad_batches must be a whole number >= 1, got {k!r}")
        self.loader, self.k = loader, k
        loader.batches_per_step = k     # (--balance: a group's batches are split by one update's weights)

    @property
    def balancer(self) -> Any:
        """--balance: the loader's (who reads which part of each batch: ``loader.py``)."""
        return self.loader.balancer

    @balancer.setter
    def balancer(self, balancer: Any) -> None:
        self.loader.balancer = balancer

    def __len__(self) -> int:
        return -(-len(self.loader) // self.k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator[MicroBatches]:
        return self.batches()

    def global_batch_size(self, step: int) -> int:
        """Samples summed into update ``step`` (from 0) of an epoch, over all processes."""
        return sum(self.global_batch_sizes(step))

    def global_batch_sizes(self, step: int) -> List[int]:
        """The size of each batch update ``step`` (from 0) of an epoch sums, over all processes
        (an open-ended stream's: of a group read already)."""
        first = step * self.k
        end = self.loader.read_batches if getattr(self.loader, "open_ended", False) else len(self.loader)
        return [self.loader.global_batch_size(b) for b in range(first, min(first + self.k, end))]

    def global_samples(self, step: int) -> int:
        """Samples of the epoch's first ``step`` updates over all processes."""
        return sum(self.global_batch_size(s) for s in range(step))

    def batches(self, skip: int = 0) -> Iterator[MicroBatches]:
        """This epoch's groups from group ``skip`` on (to resume an epoch part-way)."""
        group: List[Any] = []
        for batch in self.loader.batches(skip * self.k):
            group.append(batch)
            if len(group) == self.k:
                yield MicroBatches(group)
                group = []
        if group:
            yield MicroBatches(group)
