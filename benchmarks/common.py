"""Shared by the benchmark scripts: interleaved repetitions, medians, paired ratios."""
import statistics
import time


def measure(variants, loader, repeats):
    """Run every variant on the same batches, taking turns, ``repeats`` times after a warm-up.

    Returns ``({name: median images/s}, {name: [images/s per repetition]})``. Taking turns
    within each repetition makes slow drifts of a shared machine hit every variant alike.
    """
    rates = {k: [] for k in variants}
    for rep in range(repeats + 1):            # repetition 0 warms up
        loader.set_epoch(rep)
        batches = list(loader)
        for name, run in variants.items():
            start = time.perf_counter()
            run(batches)
            if rep:
                rates[name].append(loader.num_samples / (time.perf_counter() - start))
    return {k: statistics.median(v) for k, v in rates.items()}, rates


def paired(raw, a, b):
    """Median over repetitions of rate(a) / rate(b), each pair measured back to back."""
    return statistics.median(x / y for x, y in zip(raw[a], raw[b]))
