"""Freed host memory kept for reuse, so that a step's large temporaries do not fault their
pages in again every batch (glibc's allocator, Linux).

glibc serves an allocation above its mmap threshold (128 KiB at first, raised to the largest
block freed so far) with a fresh mapping, and gives the top of its heap back to the kernel
once more than twice that threshold is free there. A program whose temporaries change size
from batch to batch (padded text: a 1 MB embedding output of another length every batch)
keeps crossing both lines, and each time the next temporary is paged in again, 4 KiB a
minor fault, each zeroed by the kernel. Measured on the suite's text classifier (issue 22,
session 15): 6,000-18,000 faults an epoch of training, 700-3,000 an evaluation of 32 batches,
and its evaluation 1.3-1.6x slower for them, in the plain loop as in dptrain.

``keep_freed_host_memory`` fixes both lines for the process (``mallopt``): blocks up to 32 MiB
(glibc's most) come from the heap, and up to 256 MiB free at its top stays with the process.
The cost: memory a run freed is not given back to the system until the process ends (as
with PyTorch's own CPU launcher, ``torch.backends.xeon.run_cpu``, which preloads jemalloc or
tcmalloc for the same reason). Nothing is changed where the user chose for themselves
(``MALLOC_*_`` or ``GLIBC_TUNABLES`` set, another allocator in ``LD_PRELOAD``), nor with
``DPTRAIN_HOST_MALLOC=default``, nor off glibc.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Optional

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20       # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 << 20
OPT_OUT = "DPTRAIN_HOST_MALLOC"

_applied: Optional[bool] = None         # once per process


def user_chose(environ=os.environ) -> Optional[str]:
    """Why the allocator is left as it is, or None: the user set it up, or opted out."""
    if environ.get(OPT_OUT, "").lower() == "default":
        return f"{OPT_OUT}=default"
    named = sorted(k for k in environ if k.startswith("MALLOC_") and k.endswith("_"))
    if named:
        return f"{named[0]} is set"
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets glibc.malloc"
    preload = environ.get("LD_PRELOAD", "")
    for other in ("jemalloc", "tcmalloc", "mimalloc"):
        if other in preload:
            return f"{other} is preloaded"
    return None


def keep_freed_host_memory(environ=os.environ, libc: Optional[object] = None) -> bool:
    """Set glibc's mmap and trim thresholds for this process (see the module docstring), once;
    whether they are set. ``libc``: the C library (tests give a stand-in)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if user_chose(environ) is not None:
        return False
    if libc is None:
        if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
            return False
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:
            return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    # mmap first: setting either turns glibc's dynamic thresholds off, and a trim threshold
    # alone would leave every block above 128 KiB to mmap (146,000 faults an epoch of text).
    _applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _applied
