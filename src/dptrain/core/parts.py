"""Cutting ``n`` samples into consecutive parts: the one place it is done.

Every split of a batch (over devices, over processes, by ``--balance`` weights) and every
loader's share of a batch is cut here, so a batch cut over processes and then over devices
gives the same parts as one cut over all devices.

>>> even_parts(10, 3)
[4, 3, 3]
>>> weighted_parts(10, [3, 1])
[8, 2]
>>> even_part(10, 3, 1)           # (start, size) of part 1
(4, 3)
>>> even_parts(3, 2, least=2)     # (a model with BatchNorm: no part of one sample)
[3, 0]
"""
from __future__ import annotations

from typing import List, Sequence, Tuple


def even_parts(n: int, k: int, least: int = 1) -> List[int]:
    """``n`` in ``k`` parts as equal as can be: the first ``n % k`` get one more. With
    ``least``, no part holds fewer samples than that unless ``n`` does: too few samples go to
    fewer parts, the last ones empty (a model with BatchNorm cannot train on one sample: a
    last batch of 3 on 2 devices is [3, 0], not [2, 1])."""
    if least > 1 and n < least * k:
        used = max(1, n // least)
        return even_parts(n, used) + [0] * (k - used)
    base, extra = divmod(n, k)
    return [base + (i < extra) for i in range(k)]


def weighted_parts(n: int, weights: Sequence[float], least: int = 0) -> List[int]:
    """``n`` in parts proportional to ``weights`` (largest remainders first), each at least
    ``least`` when there are enough samples."""
    k = len(weights)
    floor = least if n >= least * k else 0
    rest = n - floor * k
    total = float(sum(weights)) or 1.0
    exact = [rest * w / total for w in weights]
    sizes = [int(e) for e in exact]
    for j in sorted(range(k), key=lambda j: (-(exact[j] - sizes[j]), j))[:rest - sum(sizes)]:
        sizes[j] += 1
    return [s + floor for s in sizes]


def even_part(n: int, k: int, i: int, least: int = 1) -> Tuple[int, int]:
    """``(start, size)`` of part ``i`` of ``even_parts(n, k, least)``, without making the list."""
    if least > 1 and n < least * k:
        used = max(1, n // least)
        return even_part(n, used, i) if i < used else (n, 0)
    base, extra = divmod(n, k)
    return i * base + min(i, extra), base + (i < extra)
