"""When the user's own code fails: their frames and their exception, not dptrain's internals.

A recipe, data factory, model, loss or callback that raises inside a run is shown as Python
would show it with every frame of dptrain (and of the standard library's thread pool) cut
away, then one line naming the exception and the user's frame it came from, which the
``--processes`` launcher also reads to name the failing rank. An exception with no frame
outside dptrain is dptrain's own bug: its whole traceback is what helps, and it is kept.
"""
from __future__ import annotations

import os
import traceback
from typing import List, Optional, Tuple

from .stage import stage_of

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIPPED = (_PACKAGE, os.path.join("concurrent", "futures") + os.sep, os.sep + "threading.py",
            os.path.join("torch", "nn", "modules", "module.py"))     # nn.Module.__call__


def _theirs(frame: traceback.FrameSummary) -> bool:
    return not any(part in frame.filename for part in _SKIPPED) and not frame.filename.startswith("<frozen")


def user_failure(e: BaseException) -> Optional[Tuple[str, str]]:
    """``(traceback, line)`` for an exception raised in the user's code: the traceback (and
    its chain, in Python's order) with only their frames, and the one line; None when no
    frame of ``e`` is theirs."""
    chain: List[Tuple[BaseException, str]] = []          # (exception, how it led to the next)
    current: Optional[BaseException] = e
    while current is not None and all(current is not c for c, _ in chain) and len(chain) < 10:
        cause = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        how = "\nThe above exception was the direct cause of the following exception:\n\n" if current.__cause__ \
            else "\nDuring handling of the above exception, another exception occurred:\n\n"
        chain.append((current, how))
        current = cause
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _theirs(f)]
    if not frames:
        return None
    blocks = []
    for i, (exc, how) in enumerate(reversed(chain)):
        mine = [f for f in traceback.extract_tb(exc.__traceback__) if _theirs(f)]
        head = "Traceback (your code; dptrain's frames left out):\n" + "".join(traceback.format_list(mine)) \
            if mine else ""
        blocks.append(head + _exception_only(exc))
        if i < len(chain) - 1:
            blocks.append(chain[len(chain) - 2 - i][1])      # how the next one came from this one
    message = _exception_only(e).strip().splitlines()[-1]
    where, when = frames[-1], stage_of(e)
    return "".join(blocks), (f"{message} (in your code: {where.filename}, line {where.lineno}, in {where.name}"
                             + (f"; while {when})" if when else ")"))


def _exception_only(e: BaseException) -> str:
    """``Type: message``, as Python prints it, without the notes (the stage goes in the line)."""
    shown = traceback.TracebackException(type(e), e, None)
    shown.__notes__ = None          # type: ignore[attr-defined]
    return "".join(shown.format_exception_only())
