"""Plots of runs: test accuracy and train loss per epoch, like the reference's Animator.

    dptrain train --plot run.png                          # this run
    dptrain plot one.jsonl two.jsonl -o compare.svg       # overlay runs saved with --metrics
"""
from __future__ import annotations

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
    # Test accuracy where every run has it (classification), else the test loss if they have it.
    left = next((key for key in ("test_acc", "test_loss")
                 if all(key in r for _, records in runs for r in records)), None)
    fig, axes = plt.subplots(1, 2 if left else 1, figsize=(10 if left else 5.5, 4), squeeze=False)
    panels = ([(axes[0][0], left, left.replace("test_acc", "test accuracy").replace("_", " "))] if left else []) + \
        [(axes[0][-1], "train_loss", "train loss")]
    for label, records in runs:
        epochs = [r["epoch"] for r in records]
        for ax, key, _ in panels:
            ax.plot(epochs, [r[key] for r in records], marker="o", label=label)
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
