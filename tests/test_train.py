from dptrain.config import TrainConfig
from dptrain.recipes import hyperparameters


def test_resnet18_scales_batch_and_lr_with_the_devices():
    assert hyperparameters(TrainConfig(recipe="resnet18"), 1) == (10, 256, 0.1)
    assert hyperparameters(TrainConfig(recipe="resnet18"), 2) == (10, 512, 0.2)
    assert hyperparameters(TrainConfig(recipe="resnet18", scale=False), 2) == (10, 256, 0.1)
    assert hyperparameters(TrainConfig(recipe="resnet18", batch_size=64, epochs=1), 2) == (1, 64, 0.2)


def test_global_batch_recipes_do_not_scale():
    assert hyperparameters(TrainConfig(recipe="lenet-scratch"), 4) == (10, 256, 0.2)
    assert hyperparameters(TrainConfig(recipe="lenet-mnist"), 3) == (10, 128, 0.04)
