"""Shared by the benchmark scripts: interleaved repetitions, medians, paired ratios."""
import statistics
import time


def measure(variants, loader, repeats):
    """Run every variant on the same batches, taking turns, ``repeats`` times after a warm-up.

    Returns ``({name: median images/s}, {name: [images/s per repetition]})``. Taking turns
    within each repetition makes slow drifts of a shared machine hit every variant alike;
    the order rotates from one repetition to the next, so no variant always runs right
    after the same other one (whose threads may still be winding down).
    """
    rates = {k: [] for k in variants}
    names = list(variants)
    for rep in range(repeats + 1):            # repetition 0 warms up
        loader.set_epoch(rep)
        batches = list(loader)
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            run = variants[name]
            start = time.perf_counter()
            run(batches)
            if rep:
                rates[name].append(loader.num_samples / (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in rates.items()}, rates


def paired(raw, a, b):
    """Median over repetitions of rate(a) / rate(b), each pair measured back to back."""
    return statistics.median(x / y for x, y in zip(raw[a], raw[b]))
