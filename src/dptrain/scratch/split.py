"""Split a batch along its first axis and place each part on its device."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from ..core.devices import DeviceLike, check_devices
from ..core.parts import even_parts


def shard_sizes(n: int, parts: int, even_split: bool = True) -> List[int]:
    """Return the sizes of ``parts`` consecutive shards of ``n`` samples.

    ``even_split=True`` needs ``n % parts == 0``; otherwise the first ``n % parts`` shards get
    one sample more, so sizes differ by at most one.

    >>> shard_sizes(10, 3, even_split=False)
    [4, 3, 3]
    """
    if parts < 1:
        raise ValueError("the device list is empty: pass at least one device, e.g. [dptrain.cpu(0)]")
    if n < parts:
        raise ValueError(
            f"splitting needs at least as many samples as devices, got {n} samples for "
            f"{parts} devices; use a larger batch or fewer devices")
    if even_split and n % parts:
        raise ValueError(
            f"cannot split {n} samples evenly over {parts} devices ({n} % {parts} = {n % parts}); "
            f"pass even_split=False, or a batch size divisible by {parts}")
    return even_parts(n, parts)


def _to(part: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Virtual CPU devices share host memory: a CPU part stays a zero-copy view.
    if device.type == "cpu" and part.device.type == "cpu":
        return part
    return part.to(device, non_blocking=True)


def split_and_load(data: torch.Tensor, devices: Sequence[DeviceLike],
                   even_split: bool = True) -> List[torch.Tensor]:
    """Split ``data`` along its first axis into one consecutive part per device, in order.

    >>> split_and_load(torch.arange(6), [cpu(0), cpu(1)])
    [tensor([0, 1, 2]), tensor([3, 4, 5])]          # part 0 on cpu:0, part 1 on cpu:1

    On virtual CPU devices the parts are views of ``data`` (no copy); on GPUs they are copies
    made with ``non_blocking=True``.
    """
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"split_and_load needs a torch.Tensor, got {type(data).__name__}")
    if data.dim() == 0:
        raise ValueError("split_and_load needs a tensor with a batch axis, got a 0-d tensor")
    devices = check_devices(devices)
    sizes = shard_sizes(data.shape[0], len(devices), even_split)
    return [_to(part, d) for part, d in zip(torch.split(data, sizes), devices)]


def split_batch(X: torch.Tensor, y: torch.Tensor, devices: Sequence[DeviceLike],
                even_split: bool = True) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Split features and labels the same way: sample ``k`` of ``X`` and of ``y`` land together."""
    if len(X) != len(y):
        raise ValueError(f"X and y must have the same number of samples, got {len(X)} and "
                         f"{len(y)}; pass labels for every sample")
    return split_and_load(X, devices, even_split), split_and_load(y, devices, even_split)
