"""Everyday programs, dptrain against what their users would otherwise pick, in one run.

    python benchmarks/bench_programs.py --data-dir ../shared/datasets          # about 30 minutes
    python benchmarks/bench_programs.py --smoke                               # a few steps (CI)

The programs and the framework loops are in ``everyday.py``. Four parts, each variant in
turns, ``--repeats`` times:
1. **One process** (in this process): the plain loop (a DataLoader; and for tensors in
   memory the fastest hand loop, whole batches indexed), ``dptrain.fit`` on 1 device, on its
   default devices (``auto``) and on 2 virtual devices, and Accelerate.
2. **Two processes** (``--processes``, each under ``torchrun --nproc-per-node 2``, one
   thread each): DDP with a ``DistributedSampler``, Accelerate (``ACCELERATE_USE_CPU=1``:
   without it, under torchrun on a CPU, it trains each rank alone), and ``dptrain.fit``.
3. **Interleaved** (``--interleaved``): the plain loop and ``dptrain.fit`` on 1 device in two
   processes taking turns epoch by epoch (``turns.py``), so each epoch is paired with the
   other's next to it in time; the ratio is the median over every pair of epochs after the
   first, of every repetition: the least noisy figure of the goal "1 device >= 0.97x the
   plain loop" on this VM (session 13: pairs within 0.78-1.35 where whole runs in turns gave
   0.71-1.22).
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
import statistics
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
from turns import take_turns  # noqa: E402

START, END = "<!-- bench_programs: start -->", "<!-- bench_programs: end -->"
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


def launched(framework: str, name: str, epochs: int, samples: int = 0) -> Dict[str, Any]:
    """One framework on one program in 2 processes under torchrun; rank 0's result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(HERE / "everyday.py"), "--framework", framework, "--program", name, "--epochs", str(epochs),
               "--out", out] + (["--samples", str(samples)] if samples else [])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", "PYTHONUNBUFFERED": "1"}
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:        # the first worker's traceback, not torchrun's own
            err = done.stderr
            first = err.find("Traceback")
            raise RuntimeError(f"{framework} on {name} failed ({done.returncode}): "
                               f"{err[first:first + 2500] if first >= 0 else err[-2500:]}")
        result = json.loads(Path(out).read_text())
        result["launch_total"] = time.perf_counter() - start
        return result


def interleaved(name: str, epochs: int, samples: int = 0, plain_first: bool = True) -> Dict[str, Dict[str, Any]]:
    """The plain loop and dptrain on 1 device, taking turns epoch by epoch (``turns.py``)."""
    runners = [("plain loop", (everyday.run_named, ("plain", name, epochs, samples))),
               ("dptrain, 1 device", (everyday.run_named, ("dptrain", name, epochs, samples, "cpu:0")))]
    return take_turns(dict(runners if plain_first else runners[::-1]))


def interleaved_rows(raw: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per program: each variant's median step, and dptrain's median ratio over the pairs of
    epochs (the plain loop's epoch over dptrain's; above 1: faster)."""
    rows = []
    mine = [r for r in raw if r["part"] == "1 process, interleaved"]
    for program in dict.fromkeys(r["program"] for r in mine):
        runs = [r for r in mine if r["program"] == program]
        ratios = [p / d for r in runs if r["variant"] == "dptrain, 1 device"
                  for q in runs if q["variant"] == "plain loop" and q["repeat"] == r["repeat"]
                  for p, d in zip(q["epochs"][1:], r["epochs"][1:])]
        for variant in ("plain loop", "dptrain, 1 device"):
            steps = [t / r["steps"] for r in runs if r["variant"] == variant for t in r["epochs"][1:]]
            row = {"part": "1 process, interleaved", "program": program, "variant": variant,
                   "step_us": round(1e6 * statistics.median(steps), 1), "pairs": len(ratios)}
            if variant != "plain loop":
                row["x plain loop"] = round(statistics.median(ratios), 3)
                row["ratio range"] = [round(min(ratios), 3), round(max(ratios), 3)]
            rows.append(row)
    return rows


def summarise(raw: List[Dict[str, Any]], peers: Dict[str, List[str]]) -> List[Dict[str, Any]]:
    """Per program and variant: median step time, and the median paired ratio to each peer."""
    rows = []
    order = {}
    for r in raw:           # programs and variants in the order they first ran
        order.setdefault(r["program"], len(order))
    variants = list(one_process_variants("tiny-mlp")) + list(gpu_variants("tiny-mlp")) + \
        ["ddp", "accelerate", "dptrain"]
    keys = sorted({(r["part"], r["program"], r["variant"]) for r in raw},
                  key=lambda k: (k[0], order[k[1]], variants.index(k[2]) if k[2] in variants else 99))
    for part, program, variant in [k for k in keys if k[0] != "1 process, interleaved"]:
        mine = {r["repeat"]: r for r in raw if (r["part"], r["program"], r["variant"]) == (part, program, variant)}
        row = {"part": part, "program": program, "variant": variant,
               "step_us": round(1e6 * statistics.median(r["step"] for r in mine.values()), 1),
               "setup_s": round(statistics.median(r["setup"] for r in mine.values()), 2)}
        for peer in peers.get(part, []):
            pairs = [r["step"] for r in raw if (r["part"], r["program"], r["variant"]) == (part, program, peer)]
            theirs = {r["repeat"]: r["step"] for r in raw if (r["part"], r["program"], r["variant"]) ==
                      (part, program, peer)}
            ratios = [theirs[k] / m["step"] for k, m in mine.items() if k in theirs]
            if pairs and ratios and peer != variant:
                row[f"x {peer}"] = round(statistics.median(ratios), 3)
        rows.append(row)
    return rows


def markdown(rows: List[Dict[str, Any]], header: str) -> str:
    lines = [header, ""]
    for part in ("1 process", "2 processes", "evaluation"):
        mine = [r for r in rows if r["part"] == part]
        if not mine:
            continue
        ratio_keys = sorted({k for r in mine for k in r if k.startswith("x ")})
        unit, setup = ("us/batch", "") if part == "evaluation" else ("us/step", "set-up s")
        title = "evaluation after each epoch (1 process; a quarter of the data; us per evaluation batch)" \
            if part == "evaluation" else part
        lines += [f"**{title}**", "", f"| program | variant | {unit} | {setup} | " + " | ".join(ratio_keys) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in ratio_keys) + " |"]
        for r in mine:
            lines.append(f"| {r['program']} | {r['variant']} | {r['step_us']:,.0f} | "
                         f"{'' if part == 'evaluation' else r['setup_s']} | "
                         + " | ".join(str(r.get(k, "")) for k in ratio_keys) + " |")
        lines.append("")
    mine = [r for r in rows if r["part"] == "1 process, interleaved"]
    if mine:
        lines += ["**1 process, interleaved** (the plain loop and dptrain on 1 device taking turns epoch by "
                  "epoch; ratio: the median over the pairs of epochs, and their range)", "",
                  "| program | variant | us/step | x plain loop | pairs | range |", "| --- | --- | --- | --- | --- | --- |"]
        for r in mine:
            spread = "-".join(map(str, r.get("ratio range", [])))
            lines.append(f"| {r['program']} | {r['variant']} | {r['step_us']:,.0f} | {r.get('x plain loop', '')} | "
                         f"{r['pairs'] if 'x plain loop' in r else ''} | {spread} |")
        lines.append("")
    return "\n".join(lines)


def write_results_md(text: str, path: Path) -> None:
    """Replace the part between the markers (or append it) in RESULTS.md, atomically."""
    old = path.read_text() if path.exists() else ""
    block = f"{START}\n{text}\n{END}"
    if START in old and END in old:
        new = old[:old.index(START)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


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
        for name in [n for n in args.interleaved.split(",") if n] if not args.gpu else []:
            program = everyday.PROGRAMS[name]
            samples = 2 * program.batch if args.smoke else 0
            epochs_each = 3 if args.smoke else args.interleaved_epochs
            results = interleaved(name, epochs_each, samples, plain_first=rep % 2 == 0)
            for variant, result in results.items():     # (the plain loop counts the steps: its DataLoader's)
                raw.append({"part": "1 process, interleaved", "program": name, "variant": variant, "repeat": rep,
                            "epochs": result["epochs"], "steps": results["plain loop"]["steps"]})
                print(json.dumps(raw[-1]), flush=True)
        for name in [n for n in args.evaluation.split(",") if n]:
            program = everyday.PROGRAMS[name]
            if args.smoke:
                program = everyday.shrink(program, 4 * program.batch)
            variants = list(eval_variants(args.gpu).items())
            for variant, run in variants[rep % 2:] + variants[:rep % 2]:
                result = run(program, epochs)
                record("evaluation", name, variant, rep, result, result["steps"])
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
    rows = summarise(raw, peers) + interleaved_rows(raw)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}" + (
        f", {torch.cuda.get_device_name(0)}" if args.gpu else "")
    command = "python " + " ".join(sys.argv)
    save_result({"rows": rows, "raw": raw, "smoke": args.smoke}, command, args.out)
    header = (f"Machine: {machine}. Command: `{command}`; {repeats} repetitions, {epochs} epochs each "
              f"(the first not timed; a step: the fastest of the others), variants in turns. Ratios: the peer's "
              f"step time over this variant's (above 1: faster), paired per repetition, medians.")
    text = markdown(rows, header)
    print(text)
    if not args.smoke and not args.gpu:
        write_results_md(text, Path(args.results_md))


if __name__ == "__main__":
    main()
