"""``dptrain.fit``: train any model on any data, on every device, with every feature of the loop.

Runbook (the same script everywhere):
    python train.py                                   # all GPUs, else 2 virtual CPU devices
    dptrain launch --processes 2 train.py             # 2 processes on this machine
    torchrun --nproc-per-node 2 train.py              # the same, started by torchrun
    torchrun --nnodes 2 --node-rank 0 --master-addr HOST --nproc-per-node 1 train.py   # 2 machines

    import dptrain, torch
    from torch import nn
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    X, y = torch.randn(1000, 8), torch.randn(1000, 1)
    result = dptrain.fit(model, (X, y), loss=nn.MSELoss(), optimizer=torch.optim.AdamW, lr=1e-3,
                         epochs=5, batch_size=64)
    result["history"]          # one row per epoch; model is trained in place
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Union

import torch
from torch import nn

from .config import TrainConfig
from ..parallel.optim import OptimizerSpec
from ..engine.task import Metric, Task
from ..distributed.env import rank
from .session import Log, run_task
from ..outputs.plot import draw


def fit(model: nn.Module, train_data: Any, eval_data: Any = None, *,
        loss: Optional[Callable] = None, reduction: Optional[str] = None,
        forward: Optional[Callable] = None, step: Optional[Callable] = None,
        optimizer: OptimizerSpec = "sgd", optimizer_params: Optional[Dict[str, Any]] = None,
        lr: Optional[float] = None, scheduler: Optional[Callable] = None, scheduler_interval: str = "epoch",
        metrics: Optional[Dict[str, Metric]] = None, init: Optional[Callable[[nn.Module], None]] = None,
        collate_fn: Optional[Callable] = None, num_workers: int = 0,
        epochs: int = 10, batch_size: int = 256, devices: Union[str, int, Sequence[Any]] = "auto",
        seed: int = 0, max_batches: Optional[int] = None, eval_batches: Optional[int] = None,
        kvstore: Optional[str] = "device", sync_batchnorm: bool = False, amp: Optional[str] = None,
        channels_last: bool = False, compile: Any = None, bucket_mb: float = 25.0, backend: str = "auto",
        timeout: float = 60.0, balance: Any = "even", trace: Optional[str] = None, trace_steps: int = 10,
        trace_from: int = 3,
        checkpoint_dir: Optional[str] = None, checkpoint_every: Optional[int] = None, resume: bool = False,
        overwrite: bool = False,
        metrics_file: Optional[str] = None,
        tensorboard: Optional[str] = None, plot: Optional[str] = None, on_nan: str = "stop",
        progress: bool = True, callbacks: Sequence[Any] = (), log: Optional[Log] = print,
        name: str = "custom") -> Dict[str, Any]:
    """Train ``model`` on ``train_data`` data-parallel; return the result with its ``history``.

    What (see ``dptrain.Task``): ``model`` (trained in place), ``train_data``/``eval_data``
    (a ``Dataset``, tensors ``(X, y)``, a dict of tensors), ``loss`` (any reduction; default
    cross-entropy), ``forward(model, batch) -> (output, target)`` or ``step(model, batch) ->
    loss``, ``optimizer`` (name, ``torch.optim`` class or factory, or an optimizer built on
    ``model``), ``lr``, ``scheduler(optimizer)`` stepped per ``scheduler_interval``,
    ``metrics={name: fn(output, target) -> (sum, count)}``, ``init(model)``,
    ``collate_fn``, ``num_workers``.

    How: ``epochs``, ``batch_size`` (global: split over every device of every process),
    ``devices`` (``"auto"``: all GPUs, else 2 virtual CPU devices; a count; a list),
    ``seed`` (initialisation, data order), ``max_batches``/``eval_batches`` (per epoch),
    ``kvstore`` (``device``, ``local``, ``naive``/``ring``: the hand-written allreduce),
    ``sync_batchnorm``, ``amp`` (``"bf16"``/``"fp16"``), ``channels_last``, ``compile`` (True or a
    ``torch.compile`` mode: every replica compiled before the first epoch), ``timeout`` (seconds
    several processes wait for a peer to join, or for a silent one, before naming it and
    ending), ``balance`` (``"even"``, ``"auto"``: by measured speed, or one weight per device),
    ``trace`` (a Chrome trace of ``trace_steps`` steps from step ``trace_from``), ``checkpoint_dir``
    and ``resume`` (atomic saves every epoch and on SIGINT/SIGTERM; exact resume; a folder
    holding another run's checkpoint is refused unless ``overwrite``; ``checkpoint_every=N``
    saves every N batches too),
    ``metrics_file`` (JSONL), ``tensorboard``, ``plot``, ``on_nan`` (``stop``/``skip``),
    ``progress``, ``callbacks`` (``dptrain.Callback``: hooks at each batch and epoch, which can stop
    the run and keep state in checkpoints), ``log`` (None: quiet).

    With ``WORLD_SIZE`` > 1 in the environment (``torchrun``, ``dptrain launch``) each process
    joins the process group, trains its part of every global batch, and rank 0 alone logs and
    writes files; every process returns the same result and ends with the same weights.

    >>> result = dptrain.fit(net, train_set, test_set, epochs=2)
    epoch 1, 3.1 sec, train loss 0.712, test loss 0.55, test acc 0.801
    >>> result["test_acc"], result["devices"]
    (0.834, ['cpu:0', 'cpu:1'])
    """
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict {{name: fn(output, target) -> (sum, count)}}, got "
                        f"{type(metrics).__name__}")
    torch.manual_seed(seed)
    task = Task(model, train_data, eval_data, loss=loss, reduction=reduction, forward=forward, step=step,
                optimizer=optimizer, optimizer_params=optimizer_params, lr=lr, scheduler=scheduler,
                scheduler_interval=scheduler_interval, metrics=dict(metrics or {}), init=init,
                epochs=epochs, batch_size=batch_size, kvstore=kvstore, collate_fn=collate_fn,
                callbacks=list(callbacks), name=name)
    config = TrainConfig(devices=devices, seed=seed, max_batches=max_batches, eval_batches=eval_batches,
                         num_workers=num_workers, sync_bn=sync_batchnorm, amp=amp, channels_last=channels_last,
                         compile=compile,
                         bucket_mb=bucket_mb, backend=backend, timeout=timeout, balance=balance, trace=trace,
                         trace_steps=trace_steps, trace_from=trace_from, checkpoint_dir=checkpoint_dir,
                         checkpoint_every=checkpoint_every,
                         resume=resume, overwrite=overwrite, metrics_file=metrics_file, tensorboard=tensorboard,
                         on_nan=on_nan, progress=progress)
    result = run_task(task, config, log, plot)
    if plot and rank() == 0:
        try:
            draw(result, plot)
        except ValueError as e:         # the training is done: say so, and return it all the same
            (log or print)(f"dptrain: could not draw the plot: {e}")
    return result
