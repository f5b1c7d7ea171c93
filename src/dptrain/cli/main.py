"""The ``dptrain`` command line.

Runbook:
    dptrain devices                                   # what this machine has
    dptrain train                                     # all GPUs, or 2 virtual CPU devices
    dptrain train --devices 1                         # one device, for comparison
    dptrain train --devices cpu:0,cpu:1,cpu:2 --allreduce ring
    dptrain train --epochs 1 --max-batches 20 --json  # a quick run, machine-readable result
    dptrain train --lr-find                           # the learning-rate range test, then the run at its rate
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
from dataclasses import fields
from typing import List, Optional

from ..core.devices import device_info, num_gpus, parse_devices
from ..core.errors import FAILED, INTERRUPTED, USAGE, exit_code
from ..core.stage import stage_of
from ..core.user_errors import user_failure
from ..distributed.env import DEFAULT_TIMEOUT_S, DistEnv, choose_backend, lost_peer
from ..distributed.launcher import launch, parse_nnodes
from ..distributed.worker import BOOTSTRAP, record_error
from ..engine.balance import Balancer
from ..outputs.metrics_file import read_metrics
from ..outputs.plot import describe, draw, plot_runs, plot_timeline
from ..recipes import task_for, train
from ..run.config import TrainConfig, hyperparameters
from ..run.options import flag_of
from ..run.preflight import check_outputs
from .args import build_parser


def _plot_command(args: argparse.Namespace) -> int:
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
    settings = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if flag_of(f) is not None}
    config = TrainConfig(**settings, progress=not (args.json or args.quiet))
    if _launches(args):
        check_outputs(config, args.plot)        # every file the run writes, tried before any worker starts
        choose_backend(config.backend, use_cuda=num_gpus() > 0)
        _check_batch(config, (args.processes or 1) * parse_nnodes(args.nnodes)[0])
        return _launch(["-c", BOOTSTRAP, *argv], args.processes or 1, args)     # python -m dptrain, quieter
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    result = train(config, log=log, plot=args.plot, lr_find=args.lr_find)
    if DistEnv.current().rank == 0:     # one result for the whole job, before anything that may still fail
        if args.json:
            print(json.dumps(result), flush=True)
        if args.plot:
            draw(result, args.plot)
    return 0


def _check_batch(config: TrainConfig, processes: int) -> None:
    """Every device of every process needs a sample, and --balance weights one weight per
    device: said here, before N workers start."""
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
    return launch(command, processes, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                  max_restarts=args.max_restarts, timeout_s=getattr(args, "timeout", DEFAULT_TIMEOUT_S))


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
        return USAGE
    try:
        if args.command == "devices":
            return _devices_command()
        if args.command == "plot":
            return _plot_command(args)
        if args.command == "launch":
            return _launch_command(args)
        return _train_command(args, argv)
    except BaseException as e:      # mapped by core/errors.py's exit codes, never by class here
        line = lost_peer(e) if isinstance(e, RuntimeError) else None     # a collective's peer went away
        code = FAILED if line is not None else exit_code(e)
        if code == INTERRUPTED:
            when = stage_of(e) if isinstance(e, KeyboardInterrupt) else None     # Interrupted says where
            print(f"dptrain: {str(e) or 'interrupted'}" + (f" (while {when})" if when else ""), file=sys.stderr)
            return code
        if args.debug:
            raise
        if code is None:
            failure = user_failure(e)
            if failure is None:     # no frame of the user's: dptrain's own bug, shown whole
                raise
            shown, line = failure
            print(shown, end="", file=sys.stderr)
            code = FAILED
        _error(line or e)
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

