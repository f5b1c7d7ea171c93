"""Your model and data without a Task: ``dptrain train --model pkg:Net --data pkg:load --loss mse
--metric mae``."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch

from ..core.imports import load_object
from ..engine.loss_names import loss_named
from ..engine.task import Task
from ..run.config import TrainConfig, is_import_spec


def call_factory(factory: Callable, config: TrainConfig, what: str) -> Any:
    """Call a user factory with the config if it takes an argument, else with none."""
    try:
        takes = [p for p in inspect.signature(factory).parameters.values()
                 if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        takes = []
    return factory(config) if takes else factory()


def user_task(config: TrainConfig) -> Task:
    model = call_factory(load_object(config.model, "--model"), config, "--model")
    data = call_factory(load_object(config.data, "--data"), config, "--data")
    if isinstance(data, dict) and "train" in data:
        train, test = data["train"], data.get("eval", data.get("test"))
    elif isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], torch.Tensor):
        train, test = data
    else:
        train, test = data, None
    loss: Optional[Any] = None
    if config.loss is not None:
        if is_import_spec(config.loss):
            loss = load_object(config.loss, "--loss")
            loss = loss() if isinstance(loss, type) else loss
        else:
            loss = loss_named(config.loss, "--loss", "pkg.module:name")
    named = {"metrics": [name.strip() for name in config.metric.split(",")]} if config.metric else {}
    return Task(model, train, test, loss=loss, name=config.model, **named)
