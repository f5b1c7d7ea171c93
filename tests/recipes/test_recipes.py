"""Recipes are Tasks on the public API; their defaults, scaled per device where they say so."""
import pytest
from torch import nn

from dptrain import Task
from dptrain.recipes import RECIPES, task_for
from dptrain.run.config import TrainConfig, hyperparameters


def hp(recipe, n_devices, **config):
    config = TrainConfig(recipe=recipe, **config)
    return hyperparameters(task_for(config), config, n_devices)


def test_resnet18_scales_batch_and_lr_with_the_devices():
    assert hp("resnet18", 1) == (10, 256, 0.1)
    assert hp("resnet18", 2) == (10, 512, 0.2)
    assert hp("resnet18", 2, scale=False) == (10, 256, 0.1)
    assert hp("resnet18", 2, batch_size=64, epochs=1) == (1, 64, 0.2)


def test_global_batch_recipes_do_not_scale():
    assert hp("lenet-scratch", 4) == (10, 256, 0.2)
    assert hp("lenet-mnist", 3) == (10, 128, 0.04)
    with pytest.raises(ValueError, match="--no-scale applies to tasks whose batch and lr are per device"):
        hp("lenet-mnist", 3, scale=False)


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_is_a_plain_task(name):
    task = task_for(TrainConfig(recipe=name))
    assert isinstance(task, Task) and isinstance(task.model, nn.Module) and task.name == name
    assert isinstance(task.loss, nn.CrossEntropyLoss)


def test_the_optimizer_flag_replaces_the_recipes():
    task = task_for(TrainConfig(recipe="lenet-mnist", optimizer="torch.optim:AdamW"))
    import torch
    assert task.optimizer is torch.optim.AdamW and task.optimizer_params is None


def test_an_unknown_recipe_names_the_built_in_ones():
    with pytest.raises(ValueError, match="unknown recipe 'vgg'; choose one of lenet-scratch, resnet18, lenet-mnist"):
        task_for(TrainConfig(recipe="vgg"))
