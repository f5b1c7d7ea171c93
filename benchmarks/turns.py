"""Variants that take turns epoch by epoch, each in a process of its own, one running at a time.

On a shared VM whose speed drifts by 10-40% over seconds to minutes (issue 22's sessions),
two runs one after the other can land in different weather; two epochs side by side in time
rarely do. ``take_turns`` starts every variant in a process of its own (spawned: a fresh
interpreter, the variant on its main thread); each calls its ``gate`` before each epoch's
clock starts, and the gates let exactly one variant run at a time, in turn: set-up of A,
set-up of B, epoch 1 of A, epoch 1 of B, epoch 2 of A, ... The others wait on a semaphore
(no CPU), and a variant that finished waits for the others before its process ends. Each
variant's epochs are then paired with its neighbours' in time.

Processes, not threads: PyTorch's intra-op parallel regions run about 2x slower on a thread
that is not the process's main thread with 2 OpenMP threads here (the plain loop of the tiny
MLP: 1,320-1,765 us a step on a thread against 698-875 on the main thread; alike with 1
OpenMP thread), which would distort every figure.

    >>> results = take_turns({"plain": (everyday.run_plain, (program, 6)),
    ...                       "dptrain": (everyday.run_dptrain, (program, 6, "cpu:0"))})
"""
from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any, Callable, Dict, Tuple

Variant = Tuple[Callable[..., Any], tuple]      # a module-level function (picklable) and its arguments
TIMEOUT_S = 900.0


class Baton:
    """Whose turn it is, shared by the processes: ``gate(k)`` is variant k's gate, ``finish(k)``
    takes it out of the turns."""

    def __init__(self, n: int, ctx: Any):
        self._cond = ctx.Condition()
        self._turn = ctx.Value("i", 0, lock=False)
        self._ran = ctx.Value("b", 0, lock=False)
        self._active = ctx.Array("b", [1] * n, lock=False)

    def gate(self, k: int) -> None:
        with self._cond:
            if self._turn.value == k and self._ran.value:       # back for the next epoch: the next one's turn
                self._pass()
            if not self._cond.wait_for(lambda: self._turn.value == k, timeout=TIMEOUT_S):
                raise TimeoutError(f"variant {k} waited {TIMEOUT_S:g} s for its turn")
            self._ran.value = 1

    def finish(self, k: int) -> None:
        with self._cond:
            self._active[k] = 0
            if self._turn.value == k:
                self._pass()
            self._cond.notify_all()

    def wait_all_finished(self) -> None:
        """Wait until every variant finished: a process that ends earlier would tear its
        interpreter down while another variant's last epoch runs."""
        with self._cond:
            self._cond.wait_for(lambda: not any(self._active), timeout=TIMEOUT_S)

    def _pass(self) -> None:
        n = len(self._active)
        turn = self._turn.value
        for step in range(1, n + 1):
            if self._active[(turn + step) % n]:
                self._turn.value = (turn + step) % n
                break
        self._ran.value = 0
        self._cond.notify_all()


def _run(k: int, baton: Baton, fn: Callable[..., Any], args: tuple, results: Any) -> None:
    try:
        baton.gate(k)                       # the set-up too, in its turn
        results.put((k, fn(*args, gate=lambda: baton.gate(k)), None))
    except BaseException as e:              # reported by take_turns
        results.put((k, None, f"{type(e).__name__}: {e}"))
    finally:
        baton.finish(k)
        baton.wait_all_finished()


def take_turns(variants: Dict[str, Variant]) -> Dict[str, Any]:
    """Run every ``fn(*args, gate=...)`` in a spawned process of its own, taking turns (see
    the module docstring); their results by name. A variant that fails raises here."""
    ctx = mp.get_context("spawn")
    names = list(variants)
    baton = Baton(len(names), ctx)
    results = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(k, baton, fn, args, results), name=f"turns-{name}")
             for k, (name, (fn, args)) in enumerate(variants.items())]
    for p in procs:
        p.start()
    got: Dict[str, Any] = {}
    errors = []
    try:
        for _ in procs:
            k, value, error = results.get(timeout=TIMEOUT_S * 2)
            if error is not None:
                errors.append(f"{names[k]}: {error}")
            got[names[k]] = value
    except queue.Empty:
        errors.append(f"no result within {TIMEOUT_S * 2:g} s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("; ".join(errors))
    return got
