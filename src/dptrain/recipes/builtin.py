"""The built-in recipes: the reference's three programs, as ``Task`` definitions a user
could write (nothing here is private to them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import torch
from torch import nn

from ..run.config import TrainConfig
from ..data import load_dataset
from ..models import FunctionalLeNet, GluonLeNet, init_normal, lenet_params, resnet18
from ..engine.task import Task


def init_xavier(module: nn.Module) -> None:
    """MXNet's ``init.Xavier()``: uniform, averaged fans, magnitude 3; biases zero."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)


def _images(config: TrainConfig, default: str) -> Tuple[Callable[[], Any], Callable[[], Any], str]:
    """Train and test data of an IDX dataset, loaded when the run asks (``load_dataset`` caches)."""
    name = config.dataset or default
    train = lambda: (lambda d: (d.train_X, d.train_y))(load_dataset(name, config.data_dir))   # noqa: E731
    test = lambda: (lambda d: (d.test_X, d.test_y))(load_dataset(name, config.data_dir))     # noqa: E731
    return train, test, name


def lenet_scratch(config: TrainConfig) -> Task:
    """The reference's from-scratch LeNet: its function over a parameter list, N(0, 0.01)
    weights, gradients summed with the hand-written allreduce, plain SGD."""
    train, test, name = _images(config, "fashion-mnist")
    params = lenet_params(generator=torch.Generator().manual_seed(config.seed))
    return Task(FunctionalLeNet(params), train, test, loss=nn.CrossEntropyLoss(), optimizer="sgd", lr=0.2,
                batch_size=256, kvstore="naive", name="lenet-scratch", dataset=name)


def resnet18_recipe(config: TrainConfig) -> Task:
    """The modified ResNet-18, N(0, 0.01) init; batch 256 and lr 0.1 per device."""
    train, test, name = _images(config, "fashion-mnist")
    return Task(resnet18(10, in_channels=1), train, test, loss=nn.CrossEntropyLoss(), init=init_normal,
                optimizer="sgd", lr=0.1, batch_size=256, per_device=True, channels_last=True,
                name="resnet18", dataset=name)


def lenet_mnist(config: TrainConfig) -> Task:
    """The Gluon tutorial's LeNet on MNIST, Xavier init, SGD at 0.04, batch 128."""
    train, test, name = _images(config, "mnist")
    return Task(GluonLeNet(), train, test, loss=nn.CrossEntropyLoss(), init=init_xavier, optimizer="sgd",
                lr=0.04, batch_size=128, channels_last=True, name="lenet-mnist", dataset=name)


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    make: Callable[[TrainConfig], Task]


RECIPES: Dict[str, Recipe] = {r.name: r for r in [
    Recipe("lenet-scratch", "the reference's from-scratch LeNet, allreduce written by hand", lenet_scratch),
    Recipe("resnet18", "the modified ResNet-18; batch and lr are per device", resnet18_recipe),
    Recipe("lenet-mnist", "the Gluon tutorial's LeNet on MNIST, Xavier init", lenet_mnist),
]}
