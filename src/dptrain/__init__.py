"""dptrain: data-parallel training on GPUs, virtual CPU devices and processes, on PyTorch.

>>> import dptrain
>>> result = dptrain.fit(model, (X, y), loss=nn.MSELoss(), optimizer=torch.optim.AdamW)  # any model
>>> devices = dptrain.try_all_gpus()                       # never empty
>>> Xs = dptrain.split_and_load(torch.arange(8), [dptrain.cpu(0), dptrain.cpu(1)])
>>> dptrain.allreduce([torch.ones(2), torch.ones(2)], algorithm="ring")
"""
from .scratch.allreduce import allreduce
from .data import ArrayLoader, DatasetLoader, TensorLoader, load_dataset
from .core.devices import as_device, cpu, format_devices, gpu, num_gpus, parse_devices, try_all_gpus, try_gpu
from .distributed.env import rank
from .scratch.evaluate import count_correct, evaluate_accuracy
from .run.fit import fit
from .core.runner import DeviceRunner, get_runner
from .parallel.replicas import NotInitializedError, Replicas, replicate
from .scratch.data_parallel import ScratchDataParallel, get_params, sgd
from .scratch.split import split_and_load, split_batch
from .engine.task import Task
from .parallel.trainer import Trainer

__version__ = "0.1.0"

__all__ = ["ArrayLoader", "DatasetLoader", "DeviceRunner", "NotInitializedError", "Replicas",
           "ScratchDataParallel", "Task", "TensorLoader", "Trainer", "allreduce", "as_device", "count_correct",
           "cpu", "evaluate_accuracy", "fit", "format_devices", "get_params", "get_runner", "gpu",
           "load_dataset", "num_gpus", "parse_devices", "rank", "replicate", "sgd", "split_and_load", "split_batch",
           "try_all_gpus", "try_gpu"]
