"""Recipes: functions ``(config) -> Task``; the built-in ones are short users of the public API.

    dptrain train --recipe lenet-mnist                  # built in, by name
    dptrain train --recipe my_tasks.py:make             # yours: a function (config) -> Task
    dptrain train --model my_nets:Net --data my_data:load --loss mse   # yours, without a Task
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import torch

from ..core.imports import load_object
from ..core.stage import stage
from ..engine.loss_names import LOSSES
from ..engine.task import Task
from ..run.config import TrainConfig, is_import_spec
from ..run.lr_find import task_lr_find
from ..run.session import Log, run_task
from .builtin import RECIPES, Recipe, init_xavier
from .user import call_factory, user_task

__all__ = ["LOSSES", "RECIPES", "Recipe", "init_xavier", "task_for", "train"]


def task_for(config: TrainConfig) -> Task:
    """The Task a config asks for, with the config's overrides of the optimizer applied."""
    if config.model is not None:
        task = user_task(config)
    elif is_import_spec(config.recipe):
        task = call_factory(load_object(config.recipe, "--recipe"), config, "--recipe")
        if not isinstance(task, Task):
            raise TypeError(f"--recipe {config.recipe} returned {type(task).__name__}, not a dptrain.Task")
    elif config.recipe in RECIPES:
        task = RECIPES[config.recipe].make(config)
    else:
        raise ValueError(f"unknown recipe {config.recipe!r}; choose one of {', '.join(RECIPES)}, or give your "
                         f"own as pkg.module:function or file.py:function")
    if config.optimizer is not None:
        spec = load_object(config.optimizer, "--optimizer") if is_import_spec(config.optimizer) \
            else config.optimizer.lower()
        task = dataclasses.replace(task, optimizer=spec, optimizer_params=None)
    return task




def train(config: TrainConfig, log: Optional[Log] = print, plot: Optional[str] = None,
          lr_find: bool = False) -> Dict[str, Any]:
    """Run the recipe (or ``--model``/``--data``) a config names; return the result. ``lr_find``
    (``--lr-find``): the learning-rate range test first, the run at its suggestion
    (``run/lr_find.task_lr_find``).

    >>> result = train(TrainConfig(recipe="lenet-scratch", devices="2", epochs=1))
    epoch 1, 8.1 sec, train loss 0.912, test loss 0.75, test acc 0.712
    >>> result["test_acc"], result["devices"]
    (0.712, ['cpu:0', 'cpu:1'])
    """
    torch.manual_seed(config.seed)      # before the model is built: its initial weights
    with stage(f"building the task ({config.model or config.recipe})"):
        task = task_for(config)
    if lr_find:
        with stage("the learning-rate range test (--lr-find)"):
            config = task_lr_find(task, config, log)
    return run_task(task, config, log, plot)
