"""Where a step's host time goes: the plain loop and ``dptrain.fit`` on one device, side by side.

    python benchmarks/host_profile.py --programs tiny-mlp,text --device cuda:0    # on a GPU
    python benchmarks/host_profile.py --programs text                            # on this CPU
    python benchmarks/host_profile.py --smoke                                    # 2 batches (CI)

Issue 22 asks for a step that costs what the plain loop's costs; on a GPU every operation
and every Python call a step makes is host time, and every read of a GPU number waits for
the device. For each program of ``everyday.py`` both loops train 4 epochs: the first warms
up, the second is timed (the step's wall time), the third runs under a dispatch mode that
counts the ATen operations and, on a GPU, under ``torch.cuda.set_sync_debug_mode`` that
records where the host waited for the device, and the fourth under ``cProfile`` (the
Python calls, and dptrain's functions by their own time). The report: per variant the
step's time, operations, syncs and Python calls per step, the operations dptrain runs more
(or less) often than the plain loop, the places that synchronised, and dptrain's costliest
functions. The JSON goes to ``--out``, the Markdown to ``--md`` and the screen.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import everyday  # noqa: E402
from common import save_result  # noqa: E402

TIMED, COUNTED, PROFILED = 2, 3, 4      # the epochs (1: warm-up)


class _Ops(TorchDispatchMode):
    """Counts the ATen operations dispatched while it is on."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


class Probe:
    """Runs an epoch plainly, counted, or profiled, as its number says; keeps what it saw."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seen: Dict[str, Any] = {}
        self._ops: Any = None
        self._profile: Any = None
        self._warnings: Any = None
        self._began = 0.0
        self._syncs: collections.Counter = collections.Counter()

    def start(self, epoch: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if epoch == COUNTED:
            self._ops = _Ops()
            self._ops.__enter__()
            if self.device.type == "cuda":
                self._warnings = warnings.catch_warnings()
                self._warnings.__enter__()
                warnings.simplefilter("always")
                warnings.showwarning = self._sync_seen
                torch.cuda.set_sync_debug_mode(1)
        elif epoch == PROFILED:
            self._profile = cProfile.Profile()
            self._profile.enable()
        self._began = time.perf_counter()

    def end(self, epoch: int, steps: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - self._began
        if epoch == TIMED:
            self.seen["step_us"] = round(1e6 * seconds / steps, 1)
        elif epoch == COUNTED:
            if self.device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
                self._warnings.__exit__(None, None, None)
            self._ops.__exit__(None, None, None)
            self.seen["ops_per_step"] = {k: v / steps for k, v in self._ops.counts.items()}
            self.seen["syncs_per_step"] = {k: v / steps for k, v in self._syncs.items()}
        elif epoch == PROFILED:
            self._profile.disable()
            stats = pstats.Stats(self._profile)
            self.seen["calls_per_step"] = round(stats.total_calls / steps, 1)
            own = [(f"{os.path.relpath(file, REPO_SRC) if file.startswith(REPO_SRC) else os.path.basename(file)}"
                    f":{line}({name})", tottime) for (file, line, name), (_, _, tottime, _, _) in stats.stats.items()
                   if "dptrain" in file]
            self.seen["dptrain_us_per_step"] = {k: round(1e6 * t / steps, 2)
                                                for k, t in sorted(own, key=lambda kv: -kv[1])}

    def _sync_seen(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-2] if "torch" not in f.filename and "warnings" not in
                  f.filename]
        where = frames[-1] if frames else None
        self._syncs[f"{os.path.basename(where.filename)}:{where.lineno}({where.name})" if where else "?"] += 1


REPO_SRC = str(HERE.parent / "src")


def plain(program: everyday.Program, device: str) -> Dict[str, Any]:
    """The plain loop (everyday.run_plain's), its epochs probed."""
    dev, model, opt, loader = everyday._plain(program, device)
    probe = Probe(dev)
    for epoch in range(1, PROFILED + 1):
        probe.start(epoch)
        for batch in loader:
            opt.zero_grad()
            everyday._loss(program, model, everyday._to(batch, dev)).backward()
            opt.step()
        probe.end(epoch, len(loader))
    return probe.seen


def dptrain_fit(program: everyday.Program, device: str) -> Dict[str, Any]:
    """``dptrain.fit`` on ``device`` as everyday.run_dptrain calls it, its epochs probed by a callback."""
    import dptrain
    probe = Probe(torch.device(device))

    class Probing(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            probe.start(epoch)

        def on_epoch_end(self, run, epoch, row):
            probe.end(epoch, run.batches)
    torch.manual_seed(0)
    kwargs = dict(optimizer=program.optimizer, lr=program.lr, epochs=PROFILED, batch_size=program.batch,
                  num_workers=program.workers, log=None, progress=False, devices=device, callbacks=[Probing()])
    if program.collate is not None:
        kwargs["collate_fn"] = program.collate
    if program.step is not None:
        kwargs["step"] = program.step
    dptrain.fit(program.model(), program.data(), **kwargs)
    return probe.seen


VARIANTS: Dict[str, Callable[[everyday.Program, str], Dict[str, Any]]] = {"plain loop": plain,
                                                                          "dptrain": dptrain_fit}


def markdown(results: Dict[str, Dict[str, Dict[str, Any]]], header: str) -> str:
    lines = [header, ""]
    for name, variants in results.items():
        mine, theirs = variants["dptrain"], variants["plain loop"]
        lines += [f"**{name}**", "", "| variant | us/step | ATen ops/step | syncs/step | Python calls/step |",
                  "| --- | --- | --- | --- | --- |"]
        for variant, seen in variants.items():
            lines.append(f"| {variant} | {seen['step_us']:,.0f} | {sum(seen['ops_per_step'].values()):.1f} | "
                         f"{sum(seen['syncs_per_step'].values()):.2f} | {seen['calls_per_step']:,.0f} |")
        extra = sorted(((op, mine["ops_per_step"].get(op, 0.0) - theirs["ops_per_step"].get(op, 0.0))
                        for op in set(mine["ops_per_step"]) | set(theirs["ops_per_step"])), key=lambda kv: -abs(kv[1]))
        shown = [f"`{op}` {d:+.2f}" for op, d in extra if abs(d) >= 0.01][:12]
        lines += ["", "ATen operations a step, dptrain minus the plain loop: " + (", ".join(shown) or "none")]
        for variant, seen in variants.items():
            if seen["syncs_per_step"]:
                lines.append(f"Where {variant} waited for the device (per step): " + ", ".join(
                    f"`{k}` {v:.2f}" for k, v in sorted(seen["syncs_per_step"].items(), key=lambda kv: -kv[1])))
        lines += ["", "dptrain's own time a step (cProfile, us; inflated by the profiler alike for all): " +
                  ", ".join(f"`{k}` {v}" for k, v in list(mine["dptrain_us_per_step"].items())[:10]), ""]
    return "\n".join(lines)


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default="tiny-mlp,text")
    parser.add_argument("--device", default="cpu:0", help="cuda:0 on a GPU")
    parser.add_argument("--data-dir", help="where fashion-mnist/ is (else random images)")
    parser.add_argument("--smoke", action="store_true", help="2 batches of each program: checks the script runs")
    parser.add_argument("--out", default=str(HERE / "results" / "host_profile.json"))
    parser.add_argument("--md", help="also write the Markdown here")
    args = parser.parse_args(argv)
    if args.data_dir:
        os.environ["BENCH_DATA"] = args.data_dir
    results: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for name in [n for n in args.programs.split(",") if n]:
        program = everyday.PROGRAMS[name]
        if args.smoke:
            program = everyday.shrink(program, 2 * program.batch)
        results[name] = {variant: run(program, args.device) for variant, run in VARIANTS.items()}
    device = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
    command = "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    save_result({"results": results, "smoke": args.smoke}, command, args.out)
    text = markdown(results, f"Host profile on {args.device} ({device}, torch {torch.__version__}, "
                             f"{os.cpu_count()} cores). Command: `{command}`. Epoch {TIMED} timed, {COUNTED} "
                             f"counted, {PROFILED} profiled.")
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
