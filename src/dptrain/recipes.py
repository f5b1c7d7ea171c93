"""Recipes: a model, a dataset, default hyper-parameters and how to train them data-parallel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from .config import TrainConfig
from torch import nn

from .engines import ModuleDataParallel
from .models import GluonLeNet, init_normal, lenet, lenet_params, resnet18
from .scratch import ScratchDataParallel


class Engine(Protocol):
    """What the training loop needs from a recipe's model on its devices."""
    devices: List[torch.device]

    def train_batch(self, X: torch.Tensor, y: torch.Tensor, lr: float,
                    skip_nonfinite: bool = False, global_size: Optional[int] = None) -> torch.Tensor: ...

    def predictors(self) -> List[Callable[[torch.Tensor], torch.Tensor]]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class Recipe:
    name: str
    dataset: str
    batch_size: int
    lr: float
    epochs: int
    summary: str
    build: Callable[[TrainConfig, Sequence[torch.device], float], Engine]
    uses_trainer: bool = True
    optimizer: str = "sgd"
    #: batch_size and lr are per device: on N devices both are multiplied by N (linear
    #: scaling rule) unless --no-scale.
    per_device: bool = False


def _lenet_scratch(config: TrainConfig, devices: Sequence[torch.device], lr: float) -> Engine:
    params = lenet_params(generator=torch.Generator().manual_seed(config.seed))
    return ScratchDataParallel(lenet, params, devices, allreduce=config.allreduce)


def _channels_last(config: TrainConfig, devices: Sequence[torch.device]) -> bool:
    """NHWC unless told otherwise, where it is known to pay: oneDNN's CPU kernels (GluonLeNet
    steps measured 9-10 ms NHWC against 16-17 ms NCHW) and tensor-core GPUs under autocast."""
    if config.channels_last is not None:
        return config.channels_last
    return all(d.type == "cpu" for d in devices) or config.amp is not None


def _module_engine(make: Callable[[], nn.Module], init: Callable[[nn.Module], None]):
    def build(config: TrainConfig, devices: Sequence[torch.device], lr: float) -> Engine:
        torch.manual_seed(config.seed)
        recipe = RECIPES[config.recipe]
        return ModuleDataParallel(make(), devices, config.optimizer or recipe.optimizer,
                                  {"learning_rate": lr}, kvstore=config.kvstore, init=init,
                                  sync_batchnorm=config.sync_bn, amp=config.amp_dtype,
                                  channels_last=_channels_last(config, devices),
                                  bucket_cap_mb=config.bucket_mb)
    return build


def init_xavier(module: nn.Module) -> None:
    """MXNet's ``init.Xavier()``: uniform, averaged fans, magnitude 3; biases zero."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)


RECIPES: Dict[str, Recipe] = {r.name: r for r in [
    Recipe("lenet-scratch", "fashion-mnist", batch_size=256, lr=0.2, epochs=10,
           summary="the reference's from-scratch LeNet, allreduce written by hand",
           build=_lenet_scratch, uses_trainer=False),
    Recipe("resnet18", "fashion-mnist", batch_size=256, lr=0.1, epochs=10,
           summary="the modified ResNet-18, Trainer; batch and lr are per device",
           build=_module_engine(lambda: resnet18(10, in_channels=1), init_normal), per_device=True),
    Recipe("lenet-mnist", "mnist", batch_size=128, lr=0.04, epochs=10,
           summary="the Gluon tutorial's LeNet on MNIST, Xavier init, Trainer",
           build=_module_engine(GluonLeNet, init_xavier)),
]}


def hyperparameters(config: TrainConfig, n_devices: int) -> Tuple[int, int, float]:
    """Return ``(epochs, batch_size, lr)``: the config's values, else the recipe's.

    A per-device recipe (resnet18) multiplies its default batch and lr by the device count
    (the linear scaling rule) unless ``scale=False``; values given explicitly are global.
    """
    recipe = RECIPES[config.recipe]
    scale = n_devices if recipe.per_device and config.scale else 1
    return (config.epochs or recipe.epochs, config.batch_size or recipe.batch_size * scale,
            config.lr or recipe.lr * scale)
