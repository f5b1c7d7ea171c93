"""Accuracy over several devices: split each batch, predict on every device, sum (correct, count)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..core.devices import DeviceLike, check_devices
from ..core.runner import get_runner
from .split import split_batch

Predictor = Callable[[torch.Tensor], torch.Tensor]


def _correct(i: int, predict: Predictor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return (predict(X).argmax(dim=1) == y).sum()


@contextmanager
def _eval_mode(predictors: Sequence[Predictor]) -> Iterator[None]:
    """Put modules in eval mode (BatchNorm uses running statistics), then restore them."""
    modules = [p for p in predictors if isinstance(p, nn.Module)]
    before = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(modules, before):
            m.train(mode)


def count_correct(net: Union[Predictor, Sequence[Predictor]], data: Iterable[Tuple[torch.Tensor, torch.Tensor]],
                  devices: Optional[Sequence[DeviceLike]] = None) -> Tuple[int, int]:
    """Return ``(correct, count)`` over ``data``, each batch split across ``devices``.

    ``net`` is one callable used on every device (a CPU model on virtual CPU devices), a
    sequence with one callable per device, or ``Replicas`` (then ``devices`` may be left
    out). Modules are evaluated in eval mode. A batch with fewer samples than devices uses
    only the first ``len(batch)`` devices.
    """
    replicas = isinstance(net, Sequence) and hasattr(net, "devices")     # dptrain.Replicas
    if devices is None:
        if not replicas:
            raise ValueError("pass the devices to evaluate on (only Replicas know their own)")
        devices = net.devices
    devices = check_devices(devices)
    predictors = list(net) if isinstance(net, (list, tuple)) or replicas else [net] * len(devices)
    if len(predictors) != len(devices):
        raise ValueError(f"got {len(predictors)} models for {len(devices)} devices: pass one model, "
                         f"or one per device")
    correct, count = [], 0
    with _eval_mode(predictors):
        for X, y in data:
            k = min(len(devices), len(X))
            if k == 0:
                continue
            Xs, ys = split_batch(X, y, devices[:k], even_split=False)
            runner = get_runner(devices[:k])
            correct += runner.map(_correct, predictors[:k], Xs, ys)
            count += len(y)
    # Counts stay on their devices until the end: one synchronisation, not one per batch.
    total = sum(int(c.item()) for c in correct)
    return total, count


def evaluate_accuracy(net: Union[Predictor, Sequence[Predictor]], data: Iterable[Tuple[torch.Tensor, torch.Tensor]],
                      devices: Optional[Sequence[DeviceLike]] = None) -> float:
    """Return the accuracy of ``net`` on ``data``, computed on all ``devices`` at once.

    >>> evaluate_accuracy(dp.predictors(), test_loader, [cpu(0), cpu(1)])
    0.8412
    """
    correct, count = count_correct(net, data, devices)
    if count == 0:
        raise ValueError("evaluate_accuracy got no samples: the data iterable is empty")
    return correct / count
