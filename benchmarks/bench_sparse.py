"""A sparse embedding on two processes: ``dptrain.fit`` against a hand-written DDP script.

    python benchmarks/bench_sparse.py --out benchmarks/results/sparse_s31.json

The program: an ``EmbeddingBag(200_000, 64, sparse=True)`` (bags of 32 ids, drawn from a
skewed distribution as words are) under a linear classifier, ``SparseAdam`` for the embedding
and ``Adam`` for the rest, global batch 256 (128 a process), synthetic data in memory, one
CPU thread a process, gloo on loopback:

- ``dptrain``: ``dptrain launch --processes 2 bench_sparse.py --worker dptrain``: ``fit`` with
  the two optimizers (the embedding's gradient crosses the processes sparse);
- ``DDP``: ``torchrun --nproc-per-node 2 bench_sparse.py --worker ddp``: ``DistributedSampler``,
  a ``DataLoader``, ``DistributedDataParallel`` (which sums sparse gradients as sparse too).

Each run trains 2 epochs of ``--batches`` batches and reports the second epoch's steps/s; the
two take turns ``--repeats`` times; medians and paired ratios. Before session 31 dptrain
packed the sparse gradient densely (51 MB a step here) and SparseAdam refused it.
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

VOCAB, DIM, BAG, CLASSES = 200_000, 64, 32, 10


def data(batches: int):
    import torch
    g = torch.Generator().manual_seed(0)
    n = batches * 256
    ids = (torch.rand(n, BAG, generator=g) ** 4 * VOCAB).long()     # skewed: frequent ids first
    return ids, (ids[:, 0] % CLASSES)


def model():
    import torch
    from torch import nn
    torch.manual_seed(0)
    return nn.Sequential(nn.EmbeddingBag(VOCAB, DIM, sparse=True), nn.Linear(DIM, CLASSES))


def optimizers(net):
    import torch
    return [torch.optim.SparseAdam(list(net[0].parameters()), lr=1e-3), torch.optim.Adam(list(net[1].parameters()),
                                                                                         lr=1e-3)]


def ddp_worker(args) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    dist.init_process_group("gloo")
    dataset = TensorDataset(*data(args.batches))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler)
    net = model()
    ddp = DistributedDataParallel(net)
    opts = optimizers(net)
    seconds = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for X, y in loader:
            for opt in opts:
                opt.zero_grad()
            nn.functional.cross_entropy(ddp(X), y).backward()
            for opt in opts:
                opt.step()
        seconds.append(time.perf_counter() - start)
    del ddp, opts
    __import__("gc").collect()
    dist.destroy_process_group()
    return {"steps_per_sec": args.batches / seconds[-1]}


def dptrain_worker(args) -> dict:
    import dptrain
    net = model()
    result = dptrain.fit(net, data(args.batches), optimizer=optimizers(net), batch_size=256, epochs=2,
                         devices="cpu:0", log=None, progress=False)
    return {"steps_per_sec": args.batches / result["history"][-1]["sec"]}


def main():
    parser = two_process_parser(__doc__, 60)
    args = parser.parse_args()
    if as_worker(args, {"dptrain": dptrain_worker, "ddp": ddp_worker}):
        return
    runs = alternate(["dptrain", "ddp"], args.repeats,
                     lambda kind: launch_two(kind, [str(HERE), "--worker", kind, "--batches", str(args.batches)], 29613))
    raw = {k: [r["steps_per_sec"] for r in v] for k, v in runs.items()}
    out = {
        "machine": f"{platform.processor() or platform.machine()}, 2 processes x 1 thread, gloo on loopback",
        "command": f"python benchmarks/bench_sparse.py --batches {args.batches} --repeats {args.repeats}",
        "steps_per_sec_median": {k: round(statistics.median(v), 1) for k, v in raw.items()},
        "paired_ratio_dptrain_over_ddp": round(statistics.median(a / b for a, b in zip(raw["dptrain"], raw["ddp"])), 3),
        "raw": raw}
    save_result(out, out["command"], args.out)


if __name__ == "__main__":
    main()
