"""The everyday-programs suite's figures (``bench_programs.py``): rows from the raw runs, the
markdown table, and its place in ``RESULTS.md``.

Two kinds of part:
- **in turns, run by run** ("1 process", "2 processes", "evaluation"): a run's step is its
  fastest epoch after the first; a ratio is the peer's step over the variant's, paired
  within a repetition; medians over the repetitions;
- **interleaved or paired, epoch by epoch** (``INTERLEAVED``): every epoch after the first is
  paired with the peer's epoch of the same number, run next to it in time (by another process,
  or in the same one); a ratio is the median over
  every pair of every repetition, shown with its range.
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any, Dict, List, Sequence

START, END = "<!-- bench_programs: start -->", "<!-- bench_programs: end -->"
#: Interleaved parts: (the variant measured, its peers).
INTERLEAVED = {"1 process, interleaved": ("dptrain, 1 device", ["plain loop"]),
               "evaluation, interleaved": ("dptrain, 1 device", ["plain loop"]),
               "2 processes, interleaved": ("dptrain", ["ddp", "accelerate"]),
               "1 process, paired": ("dptrain, 1 device", ["plain loop"]),
               "evaluation, paired": ("dptrain, 1 device", ["plain loop"])}
TITLES = {
    "evaluation": "evaluation after each epoch (1 process; a quarter of the data; us per evaluation batch)",
    "1 process, interleaved": "1 process, interleaved (the plain loop and dptrain on 1 device taking turns epoch "
                              "by epoch; ratio: the median over the pairs of epochs, and their range)",
    "evaluation, interleaved": "evaluation, interleaved (the same, taking turns evaluation by evaluation; us per "
                               "evaluation batch)",
    "1 process, paired": "1 process, paired in one process (the plain loop's epoch run by a callback of dptrain's, "
                         "before and after dptrain's epochs by turns; ratio: the median over the pairs, and "
                         "their range)",
    "evaluation, paired": "evaluation, paired in one process (the same, evaluation by evaluation; us per "
                          "evaluation batch)",
    "2 processes, interleaved": "2 processes, interleaved (DDP, Accelerate and dptrain, each under torchrun, "
                                "taking turns epoch by epoch; ratio: the median over the pairs of epochs, and "
                                "their range)",
}


def summarise(raw: List[Dict[str, Any]], peers: Dict[str, List[str]], variants: Sequence[str]) -> List[Dict[str, Any]]:
    """Per program and variant of the parts run by run: median step time and set-up, and the
    median paired ratio to each peer. Rows in the order of the programs' first runs, then of
    ``variants``."""
    rows = []
    order: Dict[str, int] = {}
    for r in raw:
        order.setdefault(r["program"], len(order))
    keys = sorted({(r["part"], r["program"], r["variant"]) for r in raw if r["part"] not in INTERLEAVED},
                  key=lambda k: (k[0], order[k[1]], variants.index(k[2]) if k[2] in variants else 99))
    for part, program, variant in keys:
        mine = {r["repeat"]: r for r in raw if (r["part"], r["program"], r["variant"]) == (part, program, variant)}
        row = {"part": part, "program": program, "variant": variant,
               "step_us": round(1e6 * statistics.median(r["step"] for r in mine.values()), 1),
               "setup_s": round(statistics.median(r["setup"] for r in mine.values()), 2)}
        for peer in peers.get(part, []):
            theirs = {r["repeat"]: r["step"] for r in raw if (r["part"], r["program"], r["variant"]) ==
                      (part, program, peer)}
            ratios = [theirs[k] / m["step"] for k, m in mine.items() if k in theirs]
            if ratios and peer != variant:
                row[f"x {peer}"] = round(statistics.median(ratios), 3)
        rows.append(row)
    return rows


def interleaved_rows(raw: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per interleaved part and program: each variant's median step, and the measured variant's
    median ratio to each peer over the pairs of epochs (the peer's epoch over its; above 1:
    faster), with the ratios' range."""
    rows = []
    for part, (subject, peers) in INTERLEAVED.items():
        mine = [r for r in raw if r["part"] == part]
        for program in dict.fromkeys(r["program"] for r in mine):
            runs = [r for r in mine if r["program"] == program]
            for variant in peers + [subject]:
                steps = [t / r["steps"] for r in runs if r["variant"] == variant for t in r["epochs"][1:]]
                if not steps:
                    continue
                row = {"part": part, "program": program, "variant": variant,
                       "step_us": round(1e6 * statistics.median(steps), 1)}
                if variant == subject:
                    for peer in peers:
                        ratios = [p / d for r in runs if r["variant"] == subject
                                  for q in runs if q["variant"] == peer and q["repeat"] == r["repeat"]
                                  for p, d in zip(q["epochs"][1:], r["epochs"][1:])]
                        if ratios:
                            row[f"x {peer}"] = round(statistics.median(ratios), 3)
                            row[f"range {peer}"] = [round(min(ratios), 3), round(max(ratios), 3)]
                            row["pairs"] = len(ratios)
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
        lines += [f"**{TITLES.get(part, part)}**", "",
                  f"| program | variant | {unit} | {setup} | " + " | ".join(ratio_keys) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in ratio_keys) + " |"]
        for r in mine:
            lines.append(f"| {r['program']} | {r['variant']} | {r['step_us']:,.0f} | "
                         f"{'' if part == 'evaluation' else r['setup_s']} | "
                         + " | ".join(str(r.get(k, "")) for k in ratio_keys) + " |")
        lines.append("")
    for part, (_, peers) in INTERLEAVED.items():
        mine = [r for r in rows if r["part"] == part]
        if not mine:
            continue
        heads = [h for peer in peers for h in (f"x {peer}", "range")]
        lines += [f"**{TITLES[part]}**", "", "| program | variant | us/step | " + " | ".join(heads) + " | pairs |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in heads) + " | --- |"]
        for r in mine:
            cells = [c for peer in peers for c in (str(r.get(f"x {peer}", "")),
                                                     "-".join(map(str, r.get(f"range {peer}", []))))]
            lines.append(f"| {r['program']} | {r['variant']} | {r['step_us']:,.0f} | " + " | ".join(cells)
                         + f" | {r.get('pairs', '')} |")
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
