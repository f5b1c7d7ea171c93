"""Models of the reference chapters: LeNets and the modified ResNet-18."""
from .lenet import FunctionalLeNet, GluonLeNet, ScratchLeNet, lenet, lenet_params, lenet_reference
from .resnet import Residual, init_normal, resnet18

__all__ = ["FunctionalLeNet", "GluonLeNet", "Residual", "ScratchLeNet", "init_normal", "lenet", "lenet_params",
           "lenet_reference", "resnet18"]
