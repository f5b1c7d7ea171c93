"""The model as a user hands it over: the module inside a DDP or DataParallel wrapper, and
the models dptrain can run (``predict``, ``evaluate``) but not train, refused with the fix."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter


def unwrapped(net: nn.Module) -> nn.Module:
    """The module a ``DistributedDataParallel`` or ``DataParallel`` wraps (a DDP script's
    model, handed over as it was): dptrain sums the gradients itself, and the wrapper would
    sum them once more in every backward (its hooks), copy it for each device, or fail to be
    copied (it holds its process group); ``net`` itself otherwise."""
    while isinstance(net, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        net = net.module
    return net


def check_trainable(net: nn.Module) -> None:
    """A ``TypeError`` with the fix for a model dptrain can run but not train: a TorchScript
    module (``torch.jit.script``, ``torch.jit.load``) cannot be copied for other devices with its
    parameters as leaves, nor watched for a callback's edits (``predict``/``evaluate`` take it);
    parameters made under ``torch.inference_mode()`` take no gradient."""
    if isinstance(net, getattr(torch.jit, "ScriptModule", ())):
        raise TypeError("the model is a TorchScript module (torch.jit.script or torch.jit.load), which dptrain "
                        "cannot train (its copies for other devices would not be leaves, nor can a callback's "
                        "edits be followed): train the nn.Module and script it afterwards; dptrain.predict and "
                        "dptrain.evaluate take the scripted one")
    made = next((name for name, p in net.named_parameters()
                 if not isinstance(p, UninitializedParameter) and p.is_inference()), None)
    if made is not None:
        raise TypeError(f"the model's parameter {made!r} was made under torch.inference_mode(), which no "
                        f"training can change (torch refuses it in backward): build the model outside that block")
