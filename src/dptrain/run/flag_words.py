"""``dptrain train``'s flags as ``fit``'s keywords, in the errors a Python caller reads.

A setting is declared once (``options.py``), so its checks, in ``TrainConfig`` and in the
run's preflight, name it once too: by its flag, as the command line's user writes it. A
caller of ``fit`` writes ``resume=True``, not ``--resume``; ``keyword_errors`` rewrites the
flags of an error dptrain raised into the keywords, and ``keyword_log`` those of its lines::

    --resume needs --checkpoint-dir DIR       ->  resume=True needs checkpoint_dir=DIR
    unknown --on-nan 'x'; choose one of ...   ->  unknown on_nan 'x'; choose one of ...
    --no-shuffle keeps their order            ->  shuffle=False keeps their order

An error raised in the user's own code (the innermost frame outside dptrain) is left as it is.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import fields
from typing import Any, Callable, Dict, Optional, TypeVar

from ..engine.task import Task
from .config import TrainConfig
from .options import Switch, flag_of

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)( [A-Z][A-Z0-9_.]*\b(?![a-z]))?")     # (and a METAVAR)


@functools.lru_cache(maxsize=None)
def keywords_of_flags() -> Dict[str, str]:
    """Each ``fit`` setting's flag and what a Python caller writes for it: the keyword, and
    for an on/off switch its value (``--resume``: ``resume=True``, ``--no-shuffle``:
    ``shuffle=False``)."""
    words = {"--" + f.name.replace("_", "-"): f.name for f in fields(Task)
             if f.name not in ("model", "train_data", "eval_data")}      # (--epochs, --lr, --kvstore)
    for f in fields(TrainConfig):
        flag = flag_of(f)
        if flag is None or not f.metadata.get("fit", True):
            continue
        action = f.metadata["flag_args"].get("action")
        switch = isinstance(f.metadata["kind"], Switch) or action in ("store_true", "store_false")
        words[flag] = f"{f.name}={action != 'store_false'}" if switch else f.name
        if switch:
            words["--no-" + f.name.replace("_", "-")] = f"{f.name}=False"
    return words


def as_keywords(message: str) -> str:
    """``message`` with each flag of a ``fit`` setting written as its keyword."""
    words = keywords_of_flags()

    def keyword(m: "re.Match[str]") -> str:
        flag, metavar = m.group(1), m.group(2)
        if flag not in words:
            return m.group(0)
        word = words[flag]
        if metavar is None:
            return word
        return word + metavar if "=" in word else f"{word}={metavar.strip()}"     # (--checkpoint-dir DIR)
    return _FLAG.sub(keyword, message)


def _raised_by_dptrain(e: BaseException) -> bool:
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE + os.sep)


def keyword_errors(function: F) -> F:
    """``function`` (``fit``) with the flags in dptrain's own errors written as keywords."""
    @functools.wraps(function)
    def called(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as e:
            if e.args and isinstance(e.args[0], str) and _raised_by_dptrain(e):
                e.args = (as_keywords(e.args[0]),) + e.args[1:]
            raise
    return called  # type: ignore[return-value]


def keyword_log(log: Any) -> Optional[Callable[[str], Any]]:
    """``fit``'s ``log`` with the flags in dptrain's lines written as keywords (None or False: quiet,
    True: ``print``, as ``progress=`` takes them)."""
    if log is None or log is False:
        return None
    if log is True:
        log = print
    if not callable(log):
        raise TypeError(f"log={log!r} is not a function of a line: give log=print (the default), "
                        "log=logging.getLogger(__name__).info, or log=None (or False) to print nothing")

    def said(line: str, *args: Any, **kwargs: Any) -> Any:
        return log(as_keywords(line) if isinstance(line, str) else line, *args, **kwargs)
    return said
