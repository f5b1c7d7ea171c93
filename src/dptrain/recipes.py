"""Recipes: a model, a dataset, default hyper-parameters and how to train them data-parallel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Protocol, Sequence

import torch

from .config import TrainConfig
from .models import lenet, lenet_params
from .scratch import ScratchDataParallel


class Engine(Protocol):
    """What the training loop needs from a recipe's model on its devices."""
    devices: List[torch.device]

    def train_batch(self, X: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor: ...

    def predictors(self) -> List[Callable[[torch.Tensor], torch.Tensor]]: ...


@dataclass(frozen=True)
class Recipe:
    name: str
    dataset: str
    batch_size: int
    lr: float
    epochs: int
    summary: str
    build: Callable[[TrainConfig, Sequence[torch.device]], Engine]


def _lenet_scratch(config: TrainConfig, devices: Sequence[torch.device]) -> Engine:
    params = lenet_params(generator=torch.Generator().manual_seed(config.seed))
    return ScratchDataParallel(lenet, params, devices, allreduce=config.allreduce)


RECIPES: Dict[str, Recipe] = {r.name: r for r in [
    Recipe("lenet-scratch", "fashion-mnist", batch_size=256, lr=0.2, epochs=10,
           summary="the reference's from-scratch LeNet, allreduce written by hand",
           build=_lenet_scratch),
]}
