"""dptrain: data-parallel training on GPUs, virtual CPU devices and processes, on PyTorch.

The product: train any model on any data, on every device and process.

>>> import dptrain
>>> result = dptrain.fit(model, (X, y), loss=nn.MSELoss(), optimizer=torch.optim.AdamW)   # any model
>>> result = dptrain.fit(model, train_set, test_set, callbacks=[MyCallback()])           # hooks
>>> dptrain.evaluate(model, test_set)                         # {"test_loss": ..., "test_acc": ...}
>>> model = dptrain.load_weights(Net(), "runs/own")           # a run's trained weights, in a fresh module
>>> devices = dptrain.try_all_gpus()                       # never empty: CPU devices without GPUs
>>> trainer = dptrain.Trainer(dptrain.replicate(net, devices), "sgd", {"learning_rate": 0.1})

The reference chapter's from-scratch blocks are ``dptrain.scratch`` (also here under the
names users call: ``dptrain.allreduce``, ``dptrain.split_and_load``...):

>>> Xs = dptrain.scratch.split_and_load(torch.arange(8), [dptrain.cpu(0), dptrain.cpu(1)])
>>> dptrain.scratch.allreduce([torch.ones(2), torch.ones(2)], algorithm="ring")
"""
from . import scratch
from .callbacks import BatchEnd, Callback, update_bn
from .core.devices import (as_device, cpu, format_devices, gpu, num_gpus, parse_devices, try_all_gpus,
                           try_gpu)
from .core.runner import DeviceRunner, get_runner
from .data import ArrayLoader, DatasetLoader, TensorLoader, load_dataset
from .distributed.env import rank
from .engine.task import Task
from .engine.whole_batch import whole_batch
from .engine.whole_set import whole_set
from .parallel.combined import CombinedOptimizer
from .parallel.replicas import NotInitializedError, Replicas, replicate
from .parallel.trainer import Trainer
from .run.fit import fit
from .run.evaluate import evaluate
from .run.predict import predict
from .run.lr_find import LRFinder, lr_find
from .run.resume import load_weights
# The chapter's blocks under the names users already call.
from .scratch import (ScratchDataParallel, allreduce, count_correct, evaluate_accuracy, get_params, sgd,
                      split_and_load, split_batch)

__version__ = "0.1.0"

__all__ = [
    # the product
    "fit", "evaluate", "predict", "lr_find", "LRFinder", "load_weights", "update_bn", "whole_batch", "whole_set", "Task", "Callback",
    "BatchEnd",
    "Trainer", "CombinedOptimizer",
    "Replicas", "replicate", "NotInitializedError",
    "ArrayLoader", "DatasetLoader", "TensorLoader", "load_dataset", "rank",
    # devices
    "as_device", "cpu", "gpu", "num_gpus", "try_all_gpus", "try_gpu", "parse_devices", "format_devices",
    "DeviceRunner", "get_runner",
    # the reference chapter's from-scratch blocks (dptrain.scratch)
    "scratch", "ScratchDataParallel", "allreduce", "count_correct", "evaluate_accuracy", "get_params", "sgd",
    "split_and_load", "split_batch"]
