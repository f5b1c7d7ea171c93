"""The ``dptrain`` command line.

Runbook:
    dptrain devices                                   # what this machine has
    dptrain train                                     # all GPUs, or 2 virtual CPU devices
    dptrain train --devices 1                         # one device, for comparison
    dptrain train --devices cpu:0,cpu:1,cpu:2 --allreduce ring
    dptrain train --epochs 1 --max-batches 20 --json  # a quick run, machine-readable result
    dptrain train --recipe lenet-mnist                # Gluon tutorial LeNet, Trainer + KVStore
    dptrain train --recipe resnet18 --devices cuda:0,cuda:1 --amp bf16 --channels-last
    dptrain train --recipe resnet18 --max-batches 5 --eval-batches 2   # ResNet-18 on a CPU
    dptrain train --processes 2                       # 2 worker processes, torch.distributed
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr HOST --master-port 29500 \
        -m dptrain train                              # one of two machines (node-rank 1 on the other)
    dptrain train --recipe my_tasks.py:make           # your Task: a function (config) -> dptrain.Task
    dptrain train --model my_nets:Net --data my_data:load --loss mse --optimizer torch.optim:AdamW
    dptrain launch --processes 2 train.py --lr 0.1    # your script calling dptrain.fit, 2 processes

Bad input prints one line and exits 2 (1 for missing or corrupt data); ``--debug`` shows
the traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from .allreduce import ALGORITHMS
from .optim import OPTIMIZERS
from .config import TrainConfig
from .checkpoint import CheckpointError
from .data import DataNotFoundError, IDXError
from .loop import Interrupted, NonFiniteLoss
from .devices import device_info, num_gpus, parse_devices
from .distributed.env import DistEnv, lost_peer
from .distributed.launcher import parse_nnodes, record_error
from .distributed.rendezvous import RendezvousError
from .recipes import RECIPES

USAGE_ERROR, DATA_ERROR = 2, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse also prints usage)
        self.exit(USAGE_ERROR, f"dptrain: error: {message} (see dptrain {self.prog.split()[-1]} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def _job_flags(p: argparse.ArgumentParser) -> None:
    """The elastic agent's settings, shared by ``train`` and ``launch``."""
    p.add_argument("--max-restarts", type=_natural, default=0, metavar="K",
                   help="restart all workers up to K times after a failure; with --checkpoint-dir they resume "
                        "from the last checkpoint (default: 0)")
    p.add_argument("--nnodes", default="1", metavar="N|MIN:MAX",
                   help="machines in the job, each running this command (default: 1)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="several machines: where they meet (a port on one of them)")
    p.add_argument("--rdzv-id", metavar="ID", help="several machines: the job's name, the same on each")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dptrain", description="Data-parallel training on GPUs, virtual CPU "
                     "devices and processes.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    sub.add_parser("devices", help="list the devices found (kind, name, memory, cores)")
    pl = sub.add_parser("plot", help="overlay runs saved with --metrics: accuracy and loss per epoch")
    pl.add_argument("runs", nargs="*", metavar="RUN.jsonl")
    pl.add_argument("-o", "--output", required=True, metavar="FILE", help="a .png, .svg or .pdf file")
    pl.add_argument("--timeline", metavar="TRACE.json", help="draw a --trace file instead: one row per device, "
                    "coloured phases")
    pl.add_argument("--title", default="")
    la = sub.add_parser("launch", help="run your script (or -m module) as N processes joined by "
                        "torch.distributed, as torchrun does",
                        description="Run `python SCRIPT ARGS` as N processes with torchrun's variables set "
                        "(RANK, WORLD_SIZE, MASTER_ADDR...); dptrain.fit in the script joins them.")
    la.add_argument("--processes", type=_positive_int, required=True, metavar="N",
                    help="processes on this machine (one per GPU, or the CPU cores shared among them)")
    _job_flags(la)
    la.add_argument("script", metavar="SCRIPT", help="a Python file, or -m MODULE")
    la.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    t = sub.add_parser("train", help="train a recipe, or your model and data, on several devices",
                       description="Train a recipe data-parallel; prints one line per epoch.")
    recipes = ", ".join(f"{r.name} ({r.summary})" for r in RECIPES.values())
    t.add_argument("--recipe", default="lenet-scratch", metavar="NAME",
                   help=f"what to train: {recipes}; or yours, pkg.module:function or file.py:function "
                        f"returning a dptrain.Task (default: lenet-scratch)")
    t.add_argument("--model", metavar="PKG.MODULE:FACTORY", help="your model: a function returning an nn.Module "
                   "(with --data)")
    t.add_argument("--data", metavar="PKG.MODULE:FACTORY", help="your data: a function returning the training "
                   "data, or (train, eval): Datasets or tensors (X, y)")
    t.add_argument("--loss", metavar="NAME", help="with --model: cross-entropy (default), mse, l1, huber, bce, "
                   "nll, or pkg.module:name")
    t.add_argument("--num-workers", type=_natural, default=0, metavar="N",
                   help="background processes reading a Dataset (default: 0)")
    t.add_argument("--devices", default="auto",
                   help="auto (all GPUs, else 2 virtual CPU devices), a count N, or a list "
                        "such as cpu:0,cpu:1 or cuda:0,cuda:1 (default: auto)")
    t.add_argument("--epochs", type=_positive_int, help="epochs (default: the recipe's)")
    t.add_argument("--batch-size", type=_positive_int, help="global batch size, split over the devices")
    t.add_argument("--lr", type=_positive_float, help="learning rate")
    t.add_argument("--seed", type=int, default=0, help="seed for initialisation and shuffling (default: 0)")
    t.add_argument("--data-dir", help="folder holding the dataset files (also: $DPTRAIN_DATA)")
    t.add_argument("--max-batches", type=_positive_int, metavar="N",
                   help="stop each epoch after N batches (quick runs)")
    t.add_argument("--allreduce", choices=ALGORITHMS,
                   help="sum gradients across devices with the hand-written allreduce (lenet-scratch: naive)")
    t.add_argument("--optimizer", metavar="NAME", help=f"{', '.join(OPTIMIZERS)}, or a torch.optim class as "
                   f"torch.optim:AdamW (default: the recipe's)")
    t.add_argument("--kvstore", choices=["device", "local", "naive", "ring", "none"],
                   help="where gradients are summed across devices (default: the recipe's; device)")
    t.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm statistics over the whole batch, not per device")
    t.add_argument("--eval-batches", type=_positive_int, metavar="N",
                   help="evaluate on the first N test batches only")
    t.add_argument("--amp", choices=["bf16", "fp16"], help="mixed precision (autocast) for the forward")
    t.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                   help="torch.compile every replica (MODE: default, reduce-overhead for CUDA graphs, max-autotune)")
    t.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="NHWC memory format (default: on for CPU devices and with --amp)")
    t.add_argument("--no-scale", dest="scale", action="store_false",
                   help="resnet18: keep batch and lr as given instead of scaling them by the device count")
    t.add_argument("--dataset", choices=["fashion-mnist", "mnist"],
                   help="train on this dataset instead of the recipe's")
    t.add_argument("--processes", type=_positive_int, metavar="N",
                   help="start N worker processes on this machine (one per GPU, or the CPU cores "
                        "shared among them) joined by torch.distributed")
    _job_flags(t)
    t.add_argument("--balance", default="even", metavar="even|auto|W,W,...",
                   help="split each batch over the devices (of every process) evenly, by measured speed, or by "
                        "fixed weights, one per device (default: even)")
    t.add_argument("--trace", metavar="FILE.json", help="write a Chrome/Perfetto trace of a few steps: each "
                   "device's forward, backward, gradient sum, update, and the data wait")
    t.add_argument("--trace-steps", type=_positive_int, default=10, metavar="N", help="steps to trace (default: 10)")
    t.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                   help="also save a checkpoint every N batches (bounds what a failure costs)")
    t.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                   help="torch.distributed backend (default: nccl on GPUs, gloo on CPUs)")
    t.add_argument("--bucket-mb", type=_positive_float, default=25.0, metavar="MB",
                   help="gradient bucket size for multi-process runs (default: 25)")
    t.add_argument("--timeout", type=_positive_float, default=60.0, metavar="S",
                   help="several processes: how long to wait for peers to join, or for a silent one, before "
                        "naming it and ending the job (default: 60)")
    t.add_argument("--checkpoint-dir", metavar="DIR",
                   help="save a checkpoint after every epoch (and on Ctrl-C/SIGTERM) in DIR")
    t.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    t.add_argument("--overwrite", action="store_true", help="start over in a --checkpoint-dir, --metrics file or "
                   "--tensorboard folder that holds another run's (refused otherwise)")
    t.add_argument("--metrics", metavar="FILE.jsonl", help="write one JSON record per epoch to FILE")
    t.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard scalars per epoch to DIR")
    t.add_argument("--on-nan", default="stop", choices=["stop", "skip"],
                   help="a NaN/infinite loss stops the run (default) or skips that batch")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--plot", metavar="FILE", help="plot test accuracy and train loss per epoch (.png/.svg)")
    t.add_argument("--json", action="store_true", help="print one JSON object with the result "
                   "(epoch lines go to stderr)")
    for p in (parser, t, pl, la):
        p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return parser


def _plot_command(args: argparse.Namespace) -> int:
    from .metrics import read_metrics
    from .plot import describe, plot_runs, plot_timeline
    if args.timeline:
        if args.runs:
            raise ValueError("give either runs (RUN.jsonl) or --timeline TRACE.json, not both")
        print(plot_timeline(args.timeline, args.output, args.title))
        return 0
    if not args.runs:
        raise ValueError("give the runs to plot (RUN.jsonl files written with --metrics), or --timeline TRACE.json")
    runs = []
    for path in args.runs:
        records = read_metrics(path)
        runs.append((describe(records), records))
    print(plot_runs(runs, args.output, args.title))
    return 0


def _devices_command() -> int:
    for row in device_info(parse_devices("auto")):
        memory = f"{row['memory_bytes'] / 2**30:.1f} GiB"
        unit = "SMs" if row["kind"] == "gpu" else ("core" if row["cores"] == 1 else "cores")
        print(f"{row['device']:8s} {row['kind']:12s} {row['name']}, {memory}, {row['cores']} {unit}")
    return 0


def _train_command(args: argparse.Namespace, argv: List[str]) -> int:
    from .train import train   # keeps `dptrain devices` and --help fast
    config = TrainConfig(recipe=args.recipe, model=args.model, data=args.data, loss=args.loss,
                         devices=args.devices, epochs=args.epochs,
                         batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         data_dir=args.data_dir, max_batches=args.max_batches,
                         allreduce=args.allreduce, optimizer=args.optimizer, kvstore=args.kvstore,
                         sync_bn=args.sync_bn, eval_batches=args.eval_batches, amp=args.amp, compile=args.compile,
                         channels_last=args.channels_last, scale=args.scale, dataset=args.dataset,
                         num_workers=args.num_workers, backend=args.backend, bucket_mb=args.bucket_mb,
                         timeout=args.timeout, balance=args.balance, trace=args.trace,
                         trace_steps=args.trace_steps,
                         checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                         resume=args.resume, overwrite=args.overwrite,
                         metrics_file=args.metrics,
                         on_nan=args.on_nan, progress=not (args.json or args.quiet),
                         tensorboard=args.tensorboard)
    if _launches(args):
        from .distributed.env import choose_backend
        from .preflight import check_outputs
        check_outputs(config, args.plot)        # every file the run writes, tried before any worker starts
        choose_backend(config.backend, use_cuda=num_gpus() > 0)
        _check_batch(config, (args.processes or 1) * parse_nnodes(args.nnodes)[0])
        return _launch(["-m", "dptrain", *argv], args.processes or 1, args)
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    result = train(config, log=log, plot=args.plot)
    if DistEnv.current().rank == 0:     # one result for the whole job, before anything that may still fail
        if args.json:
            print(json.dumps(result), flush=True)
        if args.plot:
            from .train import draw
            draw(result, args.plot)
    return 0


def _check_batch(config: TrainConfig, processes: int) -> None:
    """Every device of every process needs a sample, and --balance weights one weight per
    device: said here, before N workers start."""
    from .balance import Balancer
    from .devices import parse_devices
    from .recipes import hyperparameters, task_for
    per_process = 1 if config.devices in (None, "", "auto") else len(parse_devices(config.devices))
    devices = per_process * processes
    Balancer(config.balance, [per_process] * processes)
    _, batch, _ = hyperparameters(task_for(config), config, per_process) if config.batch_size is None \
        else (None, config.batch_size, None)
    if batch < devices:
        raise ValueError(f"batch size {batch} is smaller than the {devices} devices of {processes} processes: use "
                         f"--batch-size {devices} or more, or fewer --processes")


def _launches(args: argparse.Namespace) -> bool:
    """Whether this command starts workers (rather than being one)."""
    return "WORLD_SIZE" not in os.environ and ((args.processes or 1) > 1 or args.max_restarts > 0
                                               or parse_nnodes(args.nnodes)[1] > 1 or bool(args.rdzv_endpoint))


def _launch(command: List[str], processes: int, args: argparse.Namespace) -> int:
    from .distributed.launcher import launch
    return launch(command, processes, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                  max_restarts=args.max_restarts, timeout_s=getattr(args, "timeout", 60.0))


def _launch_command(args: argparse.Namespace) -> int:
    parse_nnodes(args.nnodes)
    if "WORLD_SIZE" in os.environ and int(os.environ.get("WORLD_SIZE") or 1) > 1:
        raise ValueError("dptrain launch is already inside a multi-process job (WORLD_SIZE is set): run the "
                         "script directly")
    if args.script == "-m":
        if not args.args:
            raise ValueError("dptrain launch -m needs a module name: dptrain launch --processes 2 -m pkg.train")
        command = ["-m", *args.args]
    else:
        if not os.path.isfile(args.script):
            raise ValueError(f"no script {args.script!r}: give a Python file (or -m MODULE)")
        command = [args.script, *args.args]
    return _launch(command, args.processes, args)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return USAGE_ERROR
    try:
        if args.command == "devices":
            return _devices_command()
        if args.command == "plot":
            return _plot_command(args)
        if args.command == "launch":
            return _launch_command(args)
        return _train_command(args, argv)
    except Interrupted as e:
        print(f"dptrain: {e}", file=sys.stderr)
        return 130
    except (DataNotFoundError, IDXError, CheckpointError, NonFiniteLoss, RendezvousError) as e:
        code = DATA_ERROR
        if args.debug:
            raise
        _error(e)
    except (ValueError, TypeError) as e:
        code = USAGE_ERROR
        if args.debug:
            raise
        _error(e)
    except KeyboardInterrupt as e:
        print(f"dptrain: {e or 'interrupted'}", file=sys.stderr)
        return 130
    except RuntimeError as e:       # a collective whose peer went away: one line, not gloo's traceback
        line = lost_peer(e)
        if line is None or args.debug:
            raise
        code = DATA_ERROR
        _error(line)
    return code



def _error(e) -> None:
    """The one line, on stderr and, in a worker of the elastic agent, where it reads a cause."""
    line = f"dptrain: error: {e}"
    print(line, file=sys.stderr)
    record_error(line)


def entry() -> None:
    """The ``dptrain`` command and ``python -m dptrain``: run ``main`` and exit with its code.

    A worker of a multi-process job leaves with ``os._exit`` once its output is flushed:
    under load, gloo's C++ threads were seen aborting an exiting interpreter ("terminate
    called without an active exception", 1 run in ~10) after a successful run.
    """
    code = main()
    try:
        distributed = DistEnv.from_environ().distributed
    except ValueError:          # garbage RANK/WORLD_SIZE: main() said so already
        distributed = False
    if distributed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
