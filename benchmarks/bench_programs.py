"""Everyday programs, dptrain against what their users would otherwise pick, in one run.

    python benchmarks/bench_programs.py --data-dir ../shared/datasets          # about 50 minutes
    python benchmarks/bench_programs.py --smoke                               # a few steps (CI)

The programs and the framework loops are in ``everyday.py``; the tables in
``programs_table.py``. Each part ``--repeats`` times:
1. **One process** (in this process): the plain loop (a DataLoader; and for tensors in
   memory the fastest hand loop, whole batches indexed), ``dptrain.fit`` on 1 device, on its
   default devices (``auto``) and on 2 virtual devices, and Accelerate, run after run.
2. **Two processes** (``--processes``, each under ``torchrun --nproc-per-node 2``, one
   thread each): DDP with a ``DistributedSampler``, Accelerate (``ACCELERATE_USE_CPU=1``:
   without it, under torchrun on a CPU, it trains each rank alone), and ``dptrain.fit``.
3. **Interleaved** (``--interleaved``): the plain loop and ``dptrain.fit`` on 1 device in two
   processes taking turns epoch by epoch (``turns.py``), so each epoch is paired with the
   other's next to it in time; the ratio is the median over every pair of epochs after the
   first, of every repetition: the least noisy figure of the goal "1 device >= 0.97x the
   plain loop" on this VM (session 13: pairs within 0.78-1.35 where whole runs in turns gave
   0.71-1.22). ``--interleaved-evaluation``: the same for part 4's evaluations, taking turns
   evaluation by evaluation; ``--interleaved-processes``: part 2's three torchrun jobs taking
   turns epoch by epoch (``job_turns.py``). ``--paired`` (and ``--paired-evaluation``): the
   plain loop and ``dptrain.fit`` on 1 device in one process, a callback of dptrain's running
   the plain loop's epoch just before dptrain's, then just after the next, and so on
   (``everyday.run_paired``): one interpreter for both, the least noisy measure (session 15:
   the CNN's 1.6 us of seeding a sample showed as 0.978x against 1.000x without it).
4. **Evaluation** (``--evaluation``): the plain loop and ``dptrain.fit`` on 1 device, each
   evaluating a quarter of the data after every epoch; the evaluation's time per batch
   (dptrain's seen by a callback, from ``on_evaluate_start`` to ``on_evaluate_end``).

A step's time is the fastest of the epochs after the first (the first warms up), the
epoch's training loop divided by its steps: this machine's noise only ever slows an epoch
(bursts of 20-60% from other tenants, session 11), so the fastest is the figure least
touched by it, for every variant alike; ratios are the peer's step time over the
variant's (above 1: faster), paired within a repetition, median over repetitions. Set-up is
a call's total time minus its epochs (building, loading, evaluation, ending). The JSON goes
to ``--out``; the table replaces the part of ``benchmarks/RESULTS.md`` between its markers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import everyday  # noqa: E402
from common import save_result  # noqa: E402
from job_turns import take_job_turns  # noqa: E402
from programs_table import interleaved_rows, markdown, summarise, write_results_md  # noqa: E402
from turns import take_turns  # noqa: E402

TENSOR_PROGRAMS = ("tiny-mlp", "lenet", "resnet18")


def step_seconds(result: Dict[str, Any], steps: int) -> float:
    epochs = result["epochs"][1:] or result["epochs"]
    return min(epochs) / steps


def steps_of(program: everyday.Program) -> int:
    return len(program.dataset()) // program.batch


def gpu_variants(name: str) -> Dict[str, Any]:
    """On one GPU (``--gpu``): the plain loops and dptrain on ``cuda:0``."""
    variants = {"plain loop": lambda p, e: everyday.run_plain(p, e, "cuda")}
    if name in TENSOR_PROGRAMS:
        variants["plain loop, tensors indexed"] = lambda p, e: everyday.run_plain_tensors(p, e, "cuda")
    variants["dptrain, 1 GPU"] = lambda p, e: everyday.run_dptrain(p, e, "cuda:0")
    return variants


def one_process_variants(name: str) -> Dict[str, Any]:
    variants = {"plain loop": lambda p, e: everyday.run_plain(p, e)}
    if name in TENSOR_PROGRAMS:
        variants["plain loop, tensors indexed"] = lambda p, e: everyday.run_plain_tensors(p, e)
    variants.update({
        "dptrain, 1 device": lambda p, e: everyday.run_dptrain(p, e, "cpu:0"),
        "dptrain, auto": lambda p, e: everyday.run_dptrain(p, e, None),
        "dptrain, 2 virtual devices": lambda p, e: everyday.run_dptrain(p, e, "cpu:0,cpu:1"),
        "accelerate": lambda p, e: everyday.run_accelerate(p, e),
    })
    return variants


def eval_variants(gpu: bool) -> Dict[str, Any]:
    """The evaluation part: an evaluation after every epoch, the plain loop's and dptrain's."""
    device = "cuda" if gpu else "cpu"
    return {"plain loop": lambda p, e: everyday.run_plain_eval(p, e, device),
            "dptrain, 1 device": lambda p, e: everyday.run_dptrain_eval(p, e, f"{device}:0")}


LAUNCH_ENV = {"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "PYTHONUNBUFFERED": "1"}


def launch_command(framework: str, name: str, epochs: int, out: str, samples: int = 0) -> List[str]:
    """torchrun, 2 processes, ``everyday.py`` running one framework on one program."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(HERE / "everyday.py"), "--framework", framework, "--program", name, "--epochs", str(epochs),
            "--out", out] + (["--samples", str(samples)] if samples else [])


def launched(framework: str, name: str, epochs: int, samples: int = 0) -> Dict[str, Any]:
    """One framework on one program in 2 processes under torchrun; rank 0's result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        start = time.perf_counter()
        done = subprocess.run(launch_command(framework, name, epochs, out, samples), env={**os.environ, **LAUNCH_ENV},
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:        # the first worker's traceback, not torchrun's own
            err = done.stderr
            first = err.find("Traceback")
            raise RuntimeError(f"{framework} on {name} failed ({done.returncode}): "
                               f"{err[first:first + 2500] if first >= 0 else err[-2500:]}")
        result = json.loads(Path(out).read_text())
        result["launch_total"] = time.perf_counter() - start
        return result


def launched_in_turns(frameworks: List[str], name: str, epochs: int, samples: int = 0) -> Dict[str, Dict[str, Any]]:
    """The frameworks on one program, each in 2 processes under torchrun, the jobs taking
    turns epoch by epoch (``job_turns.py``); rank 0's result of each."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = {f: os.path.join(tmp, f"{f}.json") for f in frameworks}
        take_job_turns({f: launch_command(f, name, epochs, outs[f], samples) for f in frameworks}, workers=2,
                       env={**os.environ, **LAUNCH_ENV})
        return {f: json.loads(Path(out).read_text()) for f, out in outs.items()}


def interleaved(name: str, epochs: int, samples: int = 0, plain_first: bool = True,
                evaluation: bool = False) -> Dict[str, Dict[str, Any]]:
    """The plain loop and dptrain on 1 device, taking turns epoch by epoch, or evaluation by
    evaluation (``turns.py``)."""
    plain, mine = ("plain-eval", "dptrain-eval") if evaluation else ("plain", "dptrain")
    runners = [("plain loop", (everyday.run_named, (plain, name, epochs, samples))),
               ("dptrain, 1 device", (everyday.run_named, (mine, name, epochs, samples, "cpu:0")))]
    return take_turns(dict(runners if plain_first else runners[::-1]))


def paired(name: str, epochs: int, samples: int = 0, evaluation: bool = False) -> Dict[str, Any]:
    """The plain loop and dptrain on 1 device in one fresh process, epoch by epoch or
    evaluation by evaluation (``everyday.run_paired``)."""
    return take_turns({"paired": (everyday.run_named, ("paired", name, epochs, samples, evaluation))})["paired"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="where fashion-mnist/ is (else random images)")
    parser.add_argument("--programs", default=",".join(everyday.PROGRAMS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs also run in 2 processes ('' for none)")
    parser.add_argument("--evaluation", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs whose evaluation is timed too ('' for none)")
    parser.add_argument("--interleaved", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs also run interleaved, epoch by epoch ('' for none)")
    parser.add_argument("--interleaved-evaluation", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs whose evaluations also run interleaved, one by one ('' for none)")
    parser.add_argument("--interleaved-processes", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs also run in 2 processes interleaved, epoch by epoch ('' for none)")
    parser.add_argument("--paired", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs also run paired in one process, epoch by epoch ('' for none)")
    parser.add_argument("--paired-evaluation", default="tiny-mlp,text,cnn-augment,hf-style,lenet",
                        help="programs whose evaluations also run paired in one process ('' for none)")
    parser.add_argument("--interleaved-epochs", type=int, default=6)
    parser.add_argument("--smoke", action="store_true",
                        help="two batches of each program (CI: the suite cannot rot); figures mean nothing")
    parser.add_argument("--gpu", action="store_true", help="one process on cuda:0: the plain loops and dptrain")
    parser.add_argument("--out", default=str(HERE / "results" / "programs.json"))
    parser.add_argument("--results-md", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    if args.data_dir:
        os.environ["BENCH_DATA"] = args.data_dir
    names = [n for n in args.programs.split(",") if n]
    processes = [n for n in args.processes.split(",") if n] if not args.gpu else []
    repeats, epochs = (1, 2) if args.smoke else (args.repeats, args.epochs)
    raw: List[Dict[str, Any]] = []

    def record(part, name, variant, rep, result, steps):
        raw.append({"part": part, "program": name, "variant": variant, "repeat": rep,
                    "step": step_seconds(result, steps), "setup": result["total"] - sum(result["epochs"]),
                    **({"devices": result["devices"]} if "devices" in result else {})})
        print(json.dumps(raw[-1]), flush=True)

    for rep in range(repeats):
        for name in names:
            program = everyday.PROGRAMS[name]
            if args.smoke:          # two batches
                program = everyday.shrink(program, 2 * program.batch)
            steps = steps_of(program)
            variants = list((gpu_variants if args.gpu else one_process_variants)(name).items())
            shift = rep % len(variants)         # no variant always runs after the same other one
            for variant, run in variants[shift:] + variants[:shift]:
                record("1 process", name, variant, rep, run(program, epochs), steps)
        side_by_side = [("1 process, interleaved", args.interleaved, False), ("evaluation, interleaved",
                        args.interleaved_evaluation, True), ("1 process, paired", args.paired, False),
                        ("evaluation, paired", args.paired_evaluation, True)]
        for part, names_of_part, evaluation in side_by_side if not args.gpu else []:
            for name in [n for n in names_of_part.split(",") if n]:
                program = everyday.PROGRAMS[name]
                samples = (4 if evaluation else 2) * program.batch if args.smoke else 0
                epochs_each = 3 if args.smoke else args.interleaved_epochs
                results = paired(name, epochs_each, samples, evaluation) if part.endswith("paired") else \
                    interleaved(name, epochs_each, samples, plain_first=rep % 2 == 0, evaluation=evaluation)
                for variant in ("plain loop", "dptrain, 1 device"):    # (the plain loop counts the steps)
                    raw.append({"part": part, "program": name, "variant": variant, "repeat": rep,
                                "epochs": results[variant]["epochs"], "steps": results["plain loop"]["steps"],
                                **({"first": results["first"]} if "first" in results else {})})
                    print(json.dumps(raw[-1]), flush=True)
        for name in [n for n in args.evaluation.split(",") if n]:
            program = everyday.PROGRAMS[name]
            if args.smoke:
                program = everyday.shrink(program, 4 * program.batch)
            variants = list(eval_variants(args.gpu).items())
            for variant, run in variants[rep % 2:] + variants[:rep % 2]:
                result = run(program, epochs)
                record("evaluation", name, variant, rep, result, result["steps"])
        for name in [n for n in args.interleaved_processes.split(",") if n] if not args.gpu else []:
            program = everyday.PROGRAMS[name]
            samples = 2 * program.batch if args.smoke else 0
            steps = steps_of(everyday.shrink(program, samples) if samples else program)
            frameworks = ["ddp", "accelerate", "dptrain"]
            results = launched_in_turns(frameworks[rep % 3:] + frameworks[:rep % 3], name,
                                        3 if args.smoke else args.interleaved_epochs, samples)
            for variant, result in results.items():
                raw.append({"part": "2 processes, interleaved", "program": name, "variant": variant, "repeat": rep,
                            "epochs": result["epochs"], "steps": steps})
                print(json.dumps(raw[-1]), flush=True)
        for name in processes:
            program = everyday.PROGRAMS[name]
            samples = 2 * program.batch if args.smoke else 0
            program = everyday.shrink(program, samples) if samples else program
            steps = steps_of(program)
            frameworks = ["ddp", "accelerate", "dptrain"]
            for framework in frameworks[rep % 3:] + frameworks[:rep % 3]:
                record("2 processes", name, framework, rep, launched(framework, name, epochs, samples), steps)
    peers = {"1 process": ["plain loop", "plain loop, tensors indexed", "accelerate"],
             "2 processes": ["ddp", "accelerate"], "evaluation": ["plain loop"]}
    order = list(one_process_variants("tiny-mlp")) + list(gpu_variants("tiny-mlp")) + ["ddp", "accelerate", "dptrain"]
    rows = summarise(raw, peers, order) + interleaved_rows(raw)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}" + (
        f", {torch.cuda.get_device_name(0)}" if args.gpu else "")
    command = "python " + " ".join(sys.argv)
    save_result({"rows": rows, "raw": raw, "smoke": args.smoke}, command, args.out)
    header = (f"Machine: {machine}. Command: `{command}`; {repeats} repetitions, {epochs} epochs each "
              f"(the first not timed; a step: the fastest of the others), variants in turns; the interleaved parts "
              f"{3 if args.smoke else args.interleaved_epochs} epochs each. Ratios: the peer's "
              f"step time over this variant's (above 1: faster), paired per repetition, medians.")
    text = markdown(rows, header)
    print(text)
    if not args.smoke and not args.gpu:
        write_results_md(text, Path(args.results_md))


if __name__ == "__main__":
    main()
