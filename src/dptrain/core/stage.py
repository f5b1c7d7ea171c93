"""Where in the run an exception came from: one phrase, such as "training epoch 2, batch 31".

A failure in the user's code, or a Ctrl-C, is reported by the CLI long after the run has
unwound; what the run was doing is gone by then. So each stage of a run is a ``with
stage(...)`` block, and an exception that leaves the innermost one carries its phrase
(``stage_of(e)``), and, on Python >= 3.11, a note its traceback shows to a script's user::

    with stage("building the model"):
        model = make_model()
    with stage(lambda: f"training epoch {epoch}, batch {run.batch}"):   # read when it fails
        ...

The phrase may be a function, called only when an exception passes, so that the loop pays
nothing per batch. ``noted(line)`` adds a line of advice alike (``line()``, where it gives one).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Union

Phrase = Union[str, Callable[[], str]]

_ATTRIBUTE = "_dptrain_stage"


@contextmanager
def stage(phrase: Phrase) -> Iterator[None]:
    try:
        yield
    except BaseException as e:
        if getattr(e, _ATTRIBUTE, None) is None:        # the innermost stage says it
            try:
                text = phrase() if callable(phrase) else phrase
                setattr(e, _ATTRIBUTE, text)
                if hasattr(e, "add_note") and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                    e.add_note(f"dptrain: raised while {text}")
            except Exception:       # an exception that takes no attribute: it goes on as it is
                pass
        raise


@contextmanager
def noted(line: Callable[[], Optional[str]]) -> Iterator[None]:
    """An exception that passes gets the note ``line()`` gives (``None``: none), on Python >= 3.11."""
    try:
        yield
    except Exception as e:
        text = line()
        if text and hasattr(e, "add_note"):
            e.add_note(text)
        raise


def stage_of(e: BaseException) -> Optional[str]:
    """The phrase of the innermost stage ``e`` left (or that of the exception it came from)."""
    seen = 0
    current: Optional[BaseException] = e
    while current is not None and seen < 10:
        text = getattr(current, _ATTRIBUTE, None)
        if text:
            return text
        current = current.__cause__ or current.__context__
        seen += 1
    return None
