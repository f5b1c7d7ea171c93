"""Plots of runs: test accuracy and train loss per epoch, like the reference's Animator.

    dptrain train --plot run.png                          # this run
    dptrain plot one.jsonl two.jsonl -o compare.svg       # overlay runs saved with --metrics
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple, Union

Records = List[Dict[str, Any]]


def describe(records: Records) -> str:
    """A run's label: its devices, times the processes when there are several."""
    first = records[0]
    devices = "[" + ", ".join(first.get("devices", [])) + "]"
    world = first.get("world_size", 1)
    recipe = first.get("recipe", "")
    return f"{recipe} on {world} x {devices}" if world > 1 else f"{recipe} on {devices}"


def plot_runs(runs: Sequence[Tuple[str, Records]], path: Union[str, Path], title: str = "") -> Path:
    """Draw every run's test accuracy (or test loss) and train loss against the epoch into
    ``path`` (.png/.svg/.pdf)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"plot file {path} must end in .png, .svg or .pdf")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install matplotlib (or dptrain[plot])") from None
    # Test accuracy where every run has it (classification), else the test loss if they have
    # it (on the epochs evaluated: eval_every may skip some).
    left = next((key for key in ("test_acc", "test_loss")
                 if all(any(key in r for r in records) for _, records in runs)), None)
    fig, axes = plt.subplots(1, 2 if left else 1, figsize=(10 if left else 5.5, 4), squeeze=False)
    panels = ([(axes[0][0], left, left.replace("test_acc", "test accuracy").replace("_", " "))] if left else []) + \
        [(axes[0][-1], "train_loss", "train loss")]
    for label, records in runs:
        for ax, key, _ in panels:
            ax.plot([r["epoch"] for r in records if key in r], [r[key] for r in records if key in r], marker="o",
                    label=label)
    from matplotlib.ticker import MaxNLocator
    for ax, _, name in panels:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))     # epochs are whole numbers
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or " vs ".join(label for label, _ in runs))
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    except OSError as e:
        raise ValueError(f"cannot write the plot {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return path


#: Phase colours of a timeline (a trace's event names, the first word of each).
PHASES = {"forward": "#4c72b0", "backward": "#dd8452", "all_reduce": "#c44e52", "reduce": "#937860",
          "sum_and_update": "#8172b3", "update": "#55a868", "fetch": "#da8bc3", "clear_stale": "#cccccc",
          "data": "#8c8c8c"}


def plot_timeline(trace_path: Union[str, Path], path: Union[str, Path], title: str = "") -> Path:
    """Draw a ``--trace`` file: one row per device (and per process's data and comm tracks),
    its phases as coloured bars, time in ms from the first event."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValueError(f"plot file {path} must end in .png, .svg or .pdf")
    try:
        events = json.loads(Path(trace_path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{trace_path} is not a --trace file ({type(e).__name__}): write one with "
                         f"dptrain train --trace FILE.json") from None
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError(f"{trace_path} holds no events")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    tracks = sorted({(e["pid"], e["tid"]) for e in spans})
    t0 = min(e["ts"] for e in spans)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install matplotlib (or dptrain[plot])") from None
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(tracks)))
    seen = set()
    for row, track in enumerate(tracks):
        for e in (e for e in spans if (e["pid"], e["tid"]) == track):
            phase = e["name"].split(" ")[0]
            label = phase if phase not in seen else None
            seen.add(phase)
            ax.broken_barh([((e["ts"] - t0) / 1000, max(e["dur"], 1) / 1000)], (row - 0.4, 0.8),
                           color=PHASES.get(phase, "#999999"), label=label)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"rank {p}: {names.get((p, t), t)}" for p, t in tracks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    ax.set_title(title or f"{len(tracks)} tracks, {len(spans)} events")
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise ValueError(f"cannot write the plot {path}: {e.strerror}") from None
    finally:
        plt.close(fig)
    return path


def draw(result: Dict[str, Any], path: str) -> None:
    """Plot a run's history (test accuracy or loss, train loss per epoch) into ``path``."""
    records = [{**row, "recipe": result["recipe"], "devices": result["devices"],
                "world_size": result["world_size"]} for row in result["history"]]
    plot_runs([(describe(records), records)], path)
