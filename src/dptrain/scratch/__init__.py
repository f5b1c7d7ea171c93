"""The reference chapter's blocks, written from scratch: the spec of the engine's fast paths.

``allreduce`` (naive and ring), ``split_and_load``/``split_batch``, ``get_params`` and
``sgd`` on a parameter list, ``ScratchDataParallel`` (one step of the chapter), and
``count_correct``/``evaluate_accuracy`` on several devices. A leaf: it imports nothing of
dptrain but devices and the thread runner (``core``); the engine may use its allreduce as
one gradient-sync strategy (``parallel/sync/scratch.py``).

>>> from dptrain.scratch import allreduce, split_and_load
>>> split_and_load(torch.arange(8), [dptrain.cpu(0), dptrain.cpu(1)])   # 4 samples each
>>> allreduce([torch.ones(2), torch.ones(2)], algorithm="ring")          # [2, 2] on both
"""
from .allreduce import ALGORITHMS, allreduce
from .data_parallel import ScratchDataParallel, get_params, sgd
from .evaluate import count_correct, evaluate_accuracy
from .split import shard_sizes, split_and_load, split_batch

__all__ = ["ALGORITHMS", "ScratchDataParallel", "allreduce", "count_correct", "evaluate_accuracy", "get_params",
           "sgd", "shard_sizes", "split_and_load", "split_batch"]
