"""Two processes through the public API against a hand-written DDP + DistributedSampler script.

    python benchmarks/bench_fit_processes.py --data-dir ../shared/datasets --out benchmarks/results/fit_processes.json

Both train the Gluon tutorial's LeNet on Fashion-MNIST (in memory), global batch 256
(128 per process), SGD at 0.04, one CPU thread per process, gloo on loopback:

- ``dptrain``: ``dptrain launch --processes 2 bench_fit_processes.py --worker dptrain``, a
  script that calls ``dptrain.fit`` (what a user writes);
- ``DDP``: ``torchrun --nproc-per-node 2 bench_fit_processes.py --worker ddp``, the script
  PyTorch's tutorials teach: ``DistributedSampler``, a ``DataLoader``, ``DistributedDataParallel``.

Each run trains 2 epochs of ``--batches`` batches and reports the second epoch's images/s
(the first warms up); the two take turns ``--repeats`` times; medians and paired ratios.
Start-up (interpreter, import, rendezvous) is reported apart.
"""
from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from common import alternate, as_worker, launch_two, save_result, two_process_parser  # noqa: E402


def ddp_worker(args) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import dptrain
    from dptrain.models import GluonLeNet
    from dptrain.recipes.builtin import init_xavier
    dist.init_process_group("gloo")
    data = dptrain.load_dataset("fashion-mnist", args.data_dir)
    n = args.batches * 256
    dataset = TensorDataset(data.train_X[:n], data.train_y[:n])
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler)
    torch.manual_seed(0)
    net = GluonLeNet()
    init_xavier(net)
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.04)
    seconds = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for X, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(X), y).backward()
            opt.step()
        seconds.append(time.perf_counter() - start)
    # Without this, gloo aborted 1 exit in 10 here ("terminate called without an active exception").
    del model, opt
    __import__("gc").collect()
    dist.destroy_process_group()
    return {"images_per_sec": n / seconds[-1]}


def dptrain_worker(args) -> dict:
    import torch

    import dptrain
    from dptrain.models import GluonLeNet
    from dptrain.recipes.builtin import init_xavier
    data = dptrain.load_dataset("fashion-mnist", args.data_dir)
    n = args.batches * 256
    torch.manual_seed(0)
    result = dptrain.fit(GluonLeNet(), (data.train_X[:n], data.train_y[:n]), init=init_xavier, lr=0.04,
                         batch_size=256, epochs=2, log=None, progress=False)
    return {"images_per_sec": n / result["history"][-1]["sec"]}


def main():
    parser = two_process_parser(__doc__, 100)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    if as_worker(args, {"dptrain": dptrain_worker, "ddp": ddp_worker}):
        return
    runs = alternate(["dptrain", "ddp"], args.repeats, lambda kind: launch_two(
        kind, [str(HERE), "--worker", kind, "--data-dir", args.data_dir, "--batches", str(args.batches)], 29611))
    raw = {k: [r["images_per_sec"] for r in v] for k, v in runs.items()}
    walls = {k: [r["wall_s"] for r in v] for k, v in runs.items()}
    out = {
        "machine": f"{platform.processor() or platform.machine()}, 2 processes x 1 thread, gloo on loopback",
        "command": f"python benchmarks/bench_fit_processes.py --data-dir {args.data_dir} --batches {args.batches} "
                   f"--repeats {args.repeats}",
        "images_per_sec_median": {k: round(statistics.median(v)) for k, v in raw.items()},
        "paired_ratio_dptrain_over_ddp": round(statistics.median(a / b for a, b in zip(raw["dptrain"], raw["ddp"])), 3),
        "command_wall_s_median": {k: round(statistics.median(v), 2) for k, v in walls.items()},
        "raw": raw}
    save_result(out, out["command"], args.out)


if __name__ == "__main__":
    main()
