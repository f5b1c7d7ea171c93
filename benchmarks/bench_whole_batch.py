"""A contrastive loss over the whole global batch on 2 processes: dptrain's ``whole_batch``
against the DDP script that trains the same (``torch.distributed.nn.functional.all_gather``).

    python benchmarks/bench_whole_batch.py --batches 40 --repeats 5 --out benchmarks/results/whole_batch.json

The program: an MLP encoder (64-512-512-128) of both views of each pair (one forward of the
two, as SimCLR scripts do), CLIP's symmetric InfoNCE at temperature 0.1, global batch 256
(128 a process), SGD at 0.05, one CPU thread a process, gloo on loopback. Three scripts:

- ``ddp``: ``torchrun --nproc-per-node 2``, ``DistributedSampler``, ``DistributedDataParallel``,
  each rank's embeddings gathered with the autograd-aware ``all_gather`` (the exact way);
- ``dptrain``: ``dptrain launch --processes 2``, ``fit(..., loss=dptrain.whole_batch(info_nce))``;
- ``dptrain-local``: the same with ``reduction="mean"``: each process's own negatives (not
  the one-device training: what the exchange costs).

Each trains 2 epochs of ``--batches`` batches (the second is timed); they take turns
``--repeats`` times; medians and paired ratios. ``ddp`` and ``dptrain`` see the same global
batches (DistributedSampler deals rank r the samples r, r+2, ...; the loss does not depend
on their order), so their weights after training are compared too.
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

PER_PROCESS = 128


def pairs(batches):
    import torch
    g = torch.Generator().manual_seed(0)
    a = torch.randn(batches * 2 * PER_PROCESS, 64, generator=g)
    return a, a + 0.3 * torch.randn(a.shape, generator=g)


def encoder():
    import torch
    from torch import nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 128))


def info_nce(output, target=None):
    import torch
    import torch.nn.functional as F
    za, zb = (F.normalize(z, dim=1) for z in output)
    logits = za @ zb.T / 0.1
    labels = torch.arange(len(za), device=za.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def checksum(model):
    return [float(p.detach().double().sum()) for p in model.parameters()]


def ddp_worker(args) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    dist.init_process_group("gloo")
    dataset = TensorDataset(*pairs(args.batches))
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=PER_PROCESS, sampler=sampler)
    net = encoder()
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seconds = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for a, b in loader:
            za, zb = model(torch.cat([a, b])).chunk(2)
            # each rank's loss is the whole batch's: all_gather's backward sums the W copies'
            # gradients, and DDP's mean over the W ranks undoes it
            loss = info_nce((torch.cat(dist_nn.all_gather(za)), torch.cat(dist_nn.all_gather(zb))))
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds.append(time.perf_counter() - start)
    out = {"pairs_per_sec": len(dataset) / seconds[-1], "checksum": checksum(net)}
    del model, opt
    __import__("gc").collect()      # (gloo objects aborting at exit otherwise, as bench_fit_processes)
    dist.destroy_process_group()
    return out


def dptrain_worker(args, reduction=None) -> dict:
    import torch

    import dptrain
    a, b = pairs(args.batches)
    model = encoder()
    loss = info_nce if reduction else dptrain.whole_batch(info_nce)
    result = dptrain.fit(model, (a, b), eval_data=None, loss=loss, reduction=reduction,
                         forward=lambda m, batch: (tuple(m(torch.cat(batch)).chunk(2)), None),
                         optimizer="sgd", lr=0.05, batch_size=2 * PER_PROCESS, epochs=2, shuffle=False,
                         log=None, progress=False)
    return {"pairs_per_sec": len(a) / result["history"][-1]["sec"], "checksum": checksum(model)}


WORKERS = {"ddp": ddp_worker, "dptrain": dptrain_worker,
           "dptrain-local": lambda args: dptrain_worker(args, reduction="mean")}


def main():
    parser = two_process_parser(__doc__, 40)
    for action in parser._actions:
        if action.dest == "worker":
            action.choices = list(WORKERS)
    args = parser.parse_args()
    if as_worker(args, WORKERS):
        return
    names = list(WORKERS)
    runs = alternate(names, args.repeats, lambda kind: launch_two(
        "dptrain" if kind.startswith("dptrain") else "torchrun",
        [str(HERE), "--worker", kind, "--batches", str(args.batches)], 29613))
    raw = {k: [r["pairs_per_sec"] for r in v] for k, v in runs.items()}
    exact = runs["ddp"][-1]["checksum"], runs["dptrain"][-1]["checksum"]
    out = {
        "machine": f"{platform.processor() or platform.machine()}, 2 processes x 1 thread, gloo on loopback",
        "command": f"python benchmarks/bench_whole_batch.py --batches {args.batches} --repeats {args.repeats}",
        "pairs_per_sec_median": {k: round(statistics.median(v)) for k, v in raw.items()},
        "paired_ratio_dptrain_over_ddp": round(statistics.median(
            a / b for a, b in zip(raw["dptrain"], raw["ddp"])), 3),
        "paired_ratio_dptrain_over_dptrain_local": round(statistics.median(
            a / b for a, b in zip(raw["dptrain"], raw["dptrain-local"])), 3),
        "weights_sum_max_difference_dptrain_ddp": max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(*exact)),
        "raw": raw}
    save_result(out, out["command"], args.out)


if __name__ == "__main__":
    main()
