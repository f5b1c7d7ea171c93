"""Recipes: functions ``(config) -> Task``. The built-in ones are short users of the public API.

    dptrain train --recipe lenet-mnist                  # built in, by name
    dptrain train --recipe my_tasks.py:make             # yours: a function (config) -> Task
    dptrain train --model my_nets:Net --data my_data:load --loss mse   # yours, without a Task

Nothing here is private to the built-ins: they are ``Task`` definitions, as a user writes.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from .config import TrainConfig, is_import_spec
from .data import load_dataset
from .imports import load_object
from .models import FunctionalLeNet, GluonLeNet, init_normal, lenet_params, resnet18
from .task import Task


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
                batch_size=256, epochs=10, kvstore="naive", name="lenet-scratch", dataset=name)


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

#: Loss names for ``--loss`` (a ``pkg.module:name`` works too).
LOSSES: Dict[str, Callable[[], nn.Module]] = {
    "cross-entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss, "l1": nn.L1Loss, "huber": nn.HuberLoss,
    "bce": nn.BCEWithLogitsLoss, "nll": nn.NLLLoss}


def _call(factory: Callable, config: TrainConfig, what: str) -> Any:
    """Call a user factory with the config if it takes an argument, else with none."""
    try:
        takes = [p for p in inspect.signature(factory).parameters.values()
                 if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        takes = []
    return factory(config) if takes else factory()


def _user_task(config: TrainConfig) -> Task:
    model = _call(load_object(config.model, "--model"), config, "--model")
    data = _call(load_object(config.data, "--data"), config, "--data")
    if isinstance(data, dict) and "train" in data:
        train, test = data["train"], data.get("eval", data.get("test"))
    elif isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], torch.Tensor):
        train, test = data
    else:
        train, test = data, None
    loss: Optional[Any] = None
    if config.loss is not None:
        if config.loss in LOSSES:
            loss = LOSSES[config.loss]()
        elif is_import_spec(config.loss):
            loss = load_object(config.loss, "--loss")
            loss = loss() if isinstance(loss, type) else loss
        else:
            raise ValueError(f"unknown --loss {config.loss!r}; choose one of {', '.join(LOSSES)}, or give "
                             f"pkg.module:name")
    return Task(model, train, test, loss=loss, name=config.model)


def task_for(config: TrainConfig) -> Task:
    """The Task a config asks for, with the config's overrides of the optimizer applied."""
    if config.model is not None:
        task = _user_task(config)
    elif is_import_spec(config.recipe):
        task = _call(load_object(config.recipe, "--recipe"), config, "--recipe")
        if not isinstance(task, Task):
            raise TypeError(f"--recipe {config.recipe} returned {type(task).__name__}, not a dptrain.Task")
    else:
        task = RECIPES[config.recipe].make(config)
    if config.optimizer is not None:
        spec = load_object(config.optimizer, "--optimizer") if is_import_spec(config.optimizer) \
            else config.optimizer.lower()
        task = dataclasses.replace(task, optimizer=spec, optimizer_params=None)
    return task


def hyperparameters(task: Task, config: TrainConfig, n_devices: int) -> Tuple[int, int, Optional[float]]:
    """Return ``(epochs, batch_size, lr)``: the config's values, else the task's.

    A per-device task (resnet18) multiplies its default batch and lr by the device count
    (the linear scaling rule) unless ``scale=False``; values given explicitly are global.
    ``lr`` None: the optimizer's own.
    """
    if not config.scale and not task.per_device:
        raise ValueError(f"--no-scale applies to tasks whose batch and lr are per device (resnet18); "
                         f"{task.name}'s are global already")
    scale = n_devices if task.per_device and config.scale else 1
    lr = config.lr if config.lr is not None else (task.lr * scale if task.lr is not None else None)
    return config.epochs or task.epochs, config.batch_size or task.batch_size * scale, lr
