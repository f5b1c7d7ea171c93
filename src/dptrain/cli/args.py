"""The ``dptrain`` command's arguments: the parser of every subcommand, and the checks on
numbers that argparse makes (one line, exit 2, on a bad value). ``main.py`` runs them.

``dptrain train``'s flags are made from ``TrainConfig``'s declarations (``run/options.py``);
only the command's own (processes, the elastic agent's, output format) are written here."""
from __future__ import annotations

import argparse

from dataclasses import fields

from ..core.errors import USAGE
from ..recipes import RECIPES
from ..run.config import TrainConfig
from ..run.options import add_flags, whole_number


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse also prints usage)
        self.exit(USAGE, f"dptrain: error: {message} (see dptrain {self.prog.split()[-1]} --help)\n")


def _job_flags(p: argparse.ArgumentParser) -> None:
    """The elastic agent's settings, shared by ``train`` and ``launch``."""
    p.add_argument("--max-restarts", type=whole_number(0), default=0, metavar="K",
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
    la.add_argument("--processes", type=whole_number(1), required=True, metavar="N",
                    help="processes on this machine (one per GPU, or the CPU cores shared among them)")
    _job_flags(la)
    la.add_argument("script", metavar="SCRIPT", help="a Python file, or -m MODULE")
    la.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    t = sub.add_parser("train", help="train a recipe, or your model and data, on several devices",
                       description="Train a recipe data-parallel; prints one line per epoch.")
    recipes = ", ".join(f"{r.name} ({r.summary})" for r in RECIPES.values())
    add_flags(t, fields(TrainConfig), more_help={"recipe": f"built in: {recipes}"})
    # The command's own flags (how it starts and what it prints), not settings of the run.
    t.add_argument("--processes", type=whole_number(1), metavar="N",
                   help="start N worker processes on this machine (one per GPU, or the CPU cores "
                        "shared among them) joined by torch.distributed")
    _job_flags(t)
    t.add_argument("--lr-find", action="store_true", help="run the learning-rate range test first (dptrain.lr_find: "
                   "100 steps from 1e-8 to 1), then train at its suggestion (not with --lr)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--plot", metavar="FILE", help="plot test accuracy and train loss per epoch (.png/.svg)")
    t.add_argument("--json", action="store_true", help="print one JSON object with the result "
                   "(epoch lines go to stderr)")
    for p in (parser, t, pl, la):
        p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return parser
