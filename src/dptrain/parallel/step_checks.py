"""What a ``Trainer`` step checks before it updates: the denominator it was given, and which
parameters got a gradient (``ignore_stale_grad``'s rule, as Gluon's Trainer has it)."""
from __future__ import annotations

from typing import Callable, List, Sequence

import torch

from .sync import Denominator


def check_denominator(batch_size: Denominator, several_processes: bool) -> None:
    """A ValueError unless ``batch_size`` is a usable divisor: None (no division), a 0-d
    tensor, a function giving one, or a number >= 1 (>= 0 with several processes, where one
    may have no sample in a last, small batch). A float is a weighted count (class-weighted
    cross-entropy): any positive number."""
    if batch_size is None or isinstance(batch_size, torch.Tensor) or callable(batch_size):
        return
    least = 0 if several_processes else 1
    ok = not isinstance(batch_size, bool) and isinstance(batch_size, (int, float)) and \
        batch_size != float("inf") and (batch_size >= least if isinstance(batch_size, int)
                                        else batch_size >= 0 if several_processes else batch_size > 0)
    if not ok:
        raise ValueError(f"step needs the batch size (a number >= {least}, or a positive weighted count), "
                         f"got {batch_size!r}")


def active_parameters(groups: Sequence[Sequence[torch.Tensor]], ignore_stale_grad: bool,
                      devices: Sequence[torch.device], name: Callable[[int], str]) -> List[int]:
    """Indices of the parameters to update (``groups[i]``: device ``i``'s). Without
    ``ignore_stale_grad``: every parameter must have a gradient on every device (else an error
    naming it, by ``name(j)``). With it: those with a gradient on some device (the devices
    that did not use one count as zeros, as one device on the whole batch would); a parameter
    no device used is not updated this step."""
    active = []
    for j in range(len(groups[0])):
        missing = [i for i, g in enumerate(groups) if g[j].grad is None]
        if not missing or (ignore_stale_grad and len(missing) < len(groups)):
            active.append(j)
        elif not ignore_stale_grad:
            raise ValueError(
                f"parameter {name(j)} got no gradient on device(s) "
                f"{', '.join(str(devices[i]) for i in missing)} since the last step: the "
                f"model used only some of its parameters. Call step(batch_size, "
                f"ignore_stale_grad=True) to skip such parameters")
    return active
