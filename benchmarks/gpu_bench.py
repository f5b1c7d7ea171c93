"""The GPU figures, in one run: dptrain against plain PyTorch loops on the same GPU.

    bash benchmarks/gpu_suite.sh OUTDIR --data-dir DIR      # what runs this, after the CUDA tests
    python benchmarks/gpu_bench.py --data-dir DIR --out OUTDIR/gpu.json --md OUTDIR/gpu.md [--smoke]

On one GPU (``cuda:0``):
- ``lenet-scratch`` and the tutorial LeNet (``lenet-mnist`` on Fashion-MNIST) on 1 GPU and on
  2 replicas of it (``cuda:0,cuda:0``), each against a plain loop written as the reference
  chapter writes it (the model on the GPU, each batch copied with ``.to(device)``, no
  DataParallel); the LeNet also with the host waiting on the device each step
  (``DPTRAIN_RUN_AHEAD=0``) and compiled with CUDA graphs (``--compile reduce-overhead``);
- ResNet-18: fp32, bf16 + channels-last, bf16 + channels-last compiled, and the plain loop;
  then 10 epochs of bf16 + channels-last for the test accuracy;
- the GPU with the CPU beside it (``cuda:0,cpu:0 --balance auto``, issue 13) against the GPU
  alone, for the LeNet and ResNet-18 (fp32): whether adding the CPU is worth it.
Each speed is the last of ``--epochs`` epochs (the first warms up), in images/s and
seconds per epoch. The variants run most wanted first (the issue's goals), each on its own:
one that fails is listed with its error and the others go on (the script then exits 1);
the JSON and Markdown files are rewritten after every row, and rows not started within
``--budget`` seconds are listed as skipped, so a first run on a GPU, in a lease of minutes,
keeps whatever it measured. ``--smoke`` runs every variant for a few batches on the CPU (CI
runs it, so the suite cannot rot); its figures mean nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
import torch.nn.functional as F

import dptrain
from dptrain.run.config import TrainConfig
from dptrain.models import GluonLeNet, init_normal, lenet, lenet_params, resnet18
from dptrain.recipes import RECIPES
from dptrain.recipes.builtin import init_xavier
from dptrain.run.session import run_task


def dptrain_run(recipe: str, args, devices: str, epochs: int, env: Dict[str, str] = None, **config) -> Dict[str, Any]:
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        cfg = TrainConfig(recipe=recipe, data_dir=args.data_dir, dataset="fashion-mnist", devices=devices,
                          epochs=epochs, max_batches=args.max_batches, eval_batches=args.eval_batches,
                          batch_size=args.smoke_batch, progress=False, **config)
        torch.manual_seed(0)
        task = RECIPES[recipe].make(cfg)
        if args.smoke:
            task = dataclasses.replace(task, per_device=False)
        result = run_task(task, cfg, log=None)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    last = result["history"][-1]
    return {"sec_per_epoch": last["sec"], "images_per_sec": len_epoch(args, result["batch_size"]) / last["sec"],
            "test_acc": result.get("test_acc"), **({"compile_sec": result["compile_sec"]}
                                                   if "compile_sec" in result else {}),
            **({"split": last["split"]} if last.get("split") else {})}


def len_epoch(args, batch_size: int) -> int:
    return min(60000, args.max_batches * batch_size) if args.max_batches else 60000


def _batch(args, batch_size: int) -> int:
    return args.smoke_batch or batch_size


def plain_loop(make: Callable, step: Callable, args, device: torch.device, batch_size: int, epochs: int,
               amp=None, channels_last: bool = False) -> Dict[str, Any]:
    """The reference chapter's way: the model on the device, every batch copied with .to(device)."""
    batch_size = args.smoke_batch or batch_size
    data = dptrain.load_dataset("fashion-mnist", args.data_dir)
    torch.manual_seed(0)
    state = make()
    loader = dptrain.ArrayLoader(data.train_X, data.train_y, batch_size, shuffle=True, seed=0,
                                 max_batches=args.max_batches)
    seconds = 0.0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        _sync(device)
        start = time.perf_counter()
        for X, y in loader:
            X, y = X.to(device), y.to(device)
            if channels_last:
                X = X.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
                step(state, X, y)
        _sync(device)
        seconds = time.perf_counter() - start
    return {"sec_per_epoch": seconds, "images_per_sec": len_epoch(args, batch_size) / seconds}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_lenet_scratch(device):
    def make():
        return [p.to(device).requires_grad_() for p in lenet_params(generator=torch.Generator().manual_seed(0))]

    def step(params, X, y):
        loss = F.cross_entropy(lenet(X, params), y, reduction="sum")
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, list(grads), alpha=-0.2 / len(X))
    return make, step


def plain_module(build: Callable, lr: float, device, momentum: float = 0.0, channels_last: bool = False):
    def make():
        net = build().to(device)
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        return net, torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)

    def step(state, X, y):
        net, opt = state
        opt.zero_grad()
        F.cross_entropy(net(X), y).backward()
        opt.step()
    return make, step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--md")
    parser.add_argument("--smoke", action="store_true", help="a few batches on the CPU: checks the suite runs")
    parser.add_argument("--budget", type=float, default=360.0,
                        help="seconds: rows not started by then are listed as skipped (default: 360)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        raise SystemExit("no GPU here: run with --smoke (CPU, a few batches) to check the suite itself")
    gpu, twice, mixed = ("cuda:0", "cuda:0,cuda:0", "cuda:0,cpu:0") if cuda else ("cpu:0", "cpu:0,cpu:0", "cpu:0,cpu:1")
    device = torch.device(gpu)
    args.max_batches = 2 if args.smoke else None
    args.eval_batches = 1 if args.smoke else None
    args.smoke_batch = 4 if args.smoke else None     # ResNet-18 in bf16 on a CPU: about 0.35 s an image
    quick, full = (2, 2) if args.smoke else (3, 10)
    lenet_scratch = plain_lenet_scratch(device)
    tutorial_lenet = plain_module(lambda: _init(GluonLeNet(), init_xavier), 0.04, device)
    resnet = plain_module(lambda: _init(resnet18(10, in_channels=1), init_normal), 0.1, device)
    # (model, variant, measure, peer), most wanted first: the goals, then the variants.
    plan = [
        ("lenet-scratch", "plain loop, 1 GPU", lambda: plain_loop(*lenet_scratch, args, device, 256, quick), None),
        ("lenet-scratch", "dptrain, 1 GPU", lambda: dptrain_run("lenet-scratch", args, gpu, quick),
         "plain loop, 1 GPU"),
        ("tutorial LeNet", "plain loop, 1 GPU", lambda: plain_loop(*tutorial_lenet, args, device, 128, quick), None),
        ("tutorial LeNet", "dptrain, 1 GPU", lambda: dptrain_run("lenet-mnist", args, gpu, quick),
         "plain loop, 1 GPU"),
        ("ResNet-18", "plain loop, fp32", lambda: plain_loop(*resnet, args, device, 256, quick), None),
        ("ResNet-18", "dptrain, bf16 + channels-last", lambda: dptrain_run("resnet18", args, gpu, quick, amp="bf16"),
         "plain loop, fp32"),
        ("ResNet-18", f"dptrain, bf16 + channels-last, {full} epochs (accuracy)",
         lambda: dptrain_run("resnet18", args, gpu, full, amp="bf16"), "plain loop, fp32"),
        ("ResNet-18", "dptrain, fp32", lambda: dptrain_run("resnet18", args, gpu, quick, channels_last=False),
         "plain loop, fp32"),
        ("tutorial LeNet", "dptrain, 1 GPU, host waits each step",
         lambda: dptrain_run("lenet-mnist", args, gpu, quick, env={"DPTRAIN_RUN_AHEAD": "0"}), "plain loop, 1 GPU"),
        ("tutorial LeNet", "dptrain, 1 GPU, CUDA graphs (compile reduce-overhead)",
         lambda: dptrain_run("lenet-mnist", args, gpu, quick, compile="reduce-overhead" if cuda else "default"),
         "plain loop, 1 GPU"),
        ("lenet-scratch", "dptrain, 2 replicas of 1 GPU", lambda: dptrain_run("lenet-scratch", args, twice, quick),
         "plain loop, 1 GPU"),
        ("tutorial LeNet", "dptrain, 2 replicas of 1 GPU", lambda: dptrain_run("lenet-mnist", args, twice, quick),
         "plain loop, 1 GPU"),
        ("tutorial LeNet", "dptrain, GPU + CPU, balance auto",
         lambda: dptrain_run("lenet-mnist", args, mixed, quick, balance="auto"), "dptrain, 1 GPU"),
        ("ResNet-18", "dptrain, fp32, GPU + CPU, balance auto",
         lambda: dptrain_run("resnet18", args, mixed, quick, channels_last=False, balance="auto"), "dptrain, fp32"),
    ]
    if cuda:        # (compiling ResNet-18 for the CPU takes minutes: the smoke run leaves it out)
        plan.insert(7, ("ResNet-18", "dptrain, bf16 + channels-last, compiled",
                        lambda: dptrain_run("resnet18", args, gpu, quick, amp="bf16", compile="default"),
                        "plain loop, fp32"))
    start, rows = time.time(), []
    for model, variant, measure, peer in plan:
        row = {"model": model, "variant": variant, "peer": peer}
        if time.time() - start > args.budget:
            row["skipped"] = f"over the {args.budget:.0f} s budget"
        else:
            try:        # one failing variant (a CUDA path never run before) must not cost the others
                row.update(measure())
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(args, cuda, start, rows)          # after every row: a run killed later keeps what it measured
    print(markdown(write(args, cuda, start, rows)))
    failed = [r for r in rows if "error" in r]
    if failed:
        raise SystemExit(f"{len(failed)} variant(s) failed: " + "; ".join(f"{r['model']}, {r['variant']}: {r['error']}"
                                                                        for r in failed))


def write(args, cuda: bool, start: float, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    by = {(r["model"], r["variant"]): r for r in rows}
    for r in rows:
        peer = by.get((r["model"], r["peer"]), {})
        if "images_per_sec" in r and "images_per_sec" in peer:
            r["x_peer"] = round(r["images_per_sec"] / peer["images_per_sec"], 2)
    out = {"machine": torch.cuda.get_device_name(0) if cuda else f"CPU smoke run ({platform.machine()})",
           "torch": torch.__version__, "smoke": args.smoke, "seconds": round(time.time() - start, 1), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))
    if args.md:
        Path(args.md).write_text(markdown(out))
    return out


def _init(net, init):
    init(net)
    return net


def markdown(out: Dict[str, Any]) -> str:
    lines = [f"{out['machine']}, torch {out['torch']}, {out['seconds']} s in all" +
             (" (smoke run: the figures mean nothing)" if out["smoke"] else ""), "",
             "| model | variant | s/epoch | images/s | x peer | peer | test acc |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in out["rows"]:
        if "images_per_sec" not in r:
            lines.append(f"| {r['model']} | {r['variant']} | {r.get('error') or r.get('skipped')} | | | | |")
            continue
        acc = f"{r['test_acc']:.4f}" if r.get("test_acc") is not None else ""
        split = f" (split {'/'.join(map(str, r['split']))})" if r.get("split") else ""
        lines.append(f"| {r['model']} | {r['variant']}{split} | {r['sec_per_epoch']:.3f} | {r['images_per_sec']:,.0f} | "
                     f"{r.get('x_peer', '')} | {r['peer'] or ''} | {acc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
