"""The ``dptrain`` command's arguments: the parser of every subcommand, and the checks on
numbers that argparse makes (one line, exit 2, on a bad value). ``cli.py`` runs them."""
from __future__ import annotations

import argparse

from ..core.errors import USAGE
from ..scratch.allreduce import ALGORITHMS
from ..parallel.optim import OPTIMIZERS
from ..recipes import RECIPES




class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse also prints usage)
        self.exit(USAGE, f"dptrain: error: {message} (see dptrain {self.prog.split()[-1]} --help)\n")


def _whole_number(least: int):
    """An argparse type: a whole number >= ``least``, or a one-line error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {value}")
        return value
    return parse


_positive_int = _whole_number(1)
_natural = _whole_number(0)


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
    t.add_argument("--trace-from", type=_positive_int, default=3, metavar="STEP",
                   help="the first step traced, counted from 1 over the whole run (default: 3, past the warm-up; "
                        "later to see the split --balance auto settles on)")
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
