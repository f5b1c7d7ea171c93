"""Declaring a setting once: its name, default, check, flag and help in one ``option(...)``.

``TrainConfig`` (``config.py``) is made of these declarations; the ``dptrain train`` flags
(``cli/args.py``) and ``fit``'s keywords (``fit.py``) are derived from them, so a new setting
is its declaration plus the code that uses it. The kinds below parse a flag (one line from
argparse on a bad value) and check a value given in Python (one ``ValueError``), with the
same rule.
"""
from __future__ import annotations

import argparse
import datetime
import math
from dataclasses import field
from typing import Any, Callable, Dict, Optional, Sequence


class Kind:
    """How a setting's value is checked (``check``) and read from a flag (``flag_args``)."""

    def check(self, label: str, value: Any) -> Any:
        return value

    def flag_args(self) -> Dict[str, Any]:
        return {}


class Whole(Kind):
    """A whole number >= ``least`` (and < ``below``, if given)."""

    def __init__(self, least: int, below: Optional[int] = None, parse: bool = True):
        self.least, self.below, self.parse = least, below, parse

    def check(self, label: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.least or \
                (self.below is not None and value >= self.below):
            rule = f"in [{self.least}, 2**{self.below.bit_length() - 1})" if self.below else f">= {self.least}"
            raise ValueError(f"{label} must be a whole number {rule}, got {value!r}")
        return value

    def flag_args(self) -> Dict[str, Any]:
        return {"type": whole_number(self.least) if self.parse else int}


class Positive(Kind):
    """A finite number > 0 (``unit``: what it counts, said in the error)."""

    def __init__(self, unit: str = ""):
        self.unit = unit

    def check(self, label: str, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{label} must be a finite number{self.unit} > 0, got {value!r}")
        return value

    def flag_args(self) -> Dict[str, Any]:
        return {"type": positive_number}


class Choice(Kind):
    """One of ``values`` (``what`` names it in the error)."""

    def __init__(self, values: Sequence[Any], what: Optional[str] = None, flag_choices: bool = True):
        self.values, self.what, self.flag_choices = list(values), what, flag_choices

    def check(self, label: str, value: Any) -> Any:
        if value not in self.values:
            raise ValueError(f"unknown {self.what or label} {value!r}; choose one of "
                             f"{', '.join(str(v) for v in self.values if v is not None)}")
        return value

    def flag_args(self) -> Dict[str, Any]:
        return {"choices": [v for v in self.values if v is not None]} if self.flag_choices else {}


class Switch(Kind):
    """On or off: a flag that takes no value."""

    def check(self, label: str, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError(f"{label.lstrip('-')} must be True or False, got {value!r}")
        return value

    def flag_args(self) -> Dict[str, Any]:
        return {"action": "store_true"}


class Duration(Kind):
    """A length of time > 0, in seconds: a number, a ``timedelta``, a dict of its keywords
    (``{"hours": 11}``, as Lightning's ``max_time``), or ``"HH:MM:SS"``/``"DD:HH:MM:SS"``."""

    FORMS = 'seconds, "HH:MM:SS", "DD:HH:MM:SS", a datetime.timedelta or a dict such as {"hours": 11}'

    def check(self, label: str, value: Any) -> Any:
        try:
            seconds = duration_seconds(value)
        except (TypeError, ValueError):
            raise ValueError(f"{label} must be a length of time: {self.FORMS}; got {value!r}") from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"{label} must be a length of time > 0, got {value!r}")
        return seconds

    def flag_args(self) -> Dict[str, Any]:
        def parse(text: str) -> float:
            try:
                value: Any = float(text)
            except ValueError:
                value = text            # "HH:MM:SS", or what check names as wrong
            try:
                return self.check("the time", value)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return {"type": parse}


def duration_seconds(value: Any) -> float:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return datetime.timedelta(**value).total_seconds()
    if isinstance(value, str):
        parts = [float(p) for p in value.split(":")]
        if len(parts) not in (3, 4) or any(p < 0 for p in parts):
            raise ValueError(value)
        return sum(p * unit for p, unit in zip(reversed(parts), (1, 60, 3600, 86400)))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(value)
    return float(value)


def option(default: Any, help: str, kind: Optional[Kind] = None, check: Optional[Callable[[Any], Any]] = None,
           flag: Optional[str] = "", fit: bool = True, metavar: Optional[str] = None,
           **flag_args: Any) -> Any:
    """Declare a ``TrainConfig`` field. ``kind`` or ``check`` validates a value (None, the
    "not given" of an optional setting, is not checked); ``flag``: the ``dptrain train`` flag
    ("" for ``--name-with-dashes``, None for none); ``fit``: whether ``fit`` takes it as a
    keyword; ``flag_args``: what argparse needs beyond the kind's."""
    return field(default=default, metadata={"help": help, "kind": kind, "check": check, "flag": flag, "fit": fit,
                                            "metavar": metavar, "flag_args": flag_args})


def flag_of(f) -> Optional[str]:
    """The ``dptrain train`` flag of a ``TrainConfig`` field, or None."""
    flag = f.metadata.get("flag", "")
    return None if flag is None else flag or "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, fields: Sequence[Any], more_help: Optional[Dict[str, str]] = None) -> None:
    """One flag per declared field that has one, with its help (and ``more_help[name]``),
    default and parser."""
    for f in fields:
        flag = flag_of(f)
        if flag is None:
            continue
        meta = f.metadata
        kwargs: Dict[str, Any] = dict((meta["kind"].flag_args() if meta["kind"] else {}), **meta["flag_args"])
        if kwargs.get("action") not in ("store_true", "store_false"):
            kwargs.setdefault("metavar", meta["metavar"])
        default = "" if f.default is None or isinstance(f.default, bool) else f" (default: {f.default:g})" \
            if isinstance(f.default, float) else f" (default: {f.default})"
        extra = f"; {more_help[f.name]}" if more_help and f.name in more_help else ""
        parser.add_argument(flag, dest=f.name, default=f.default, help=meta["help"] + extra + default, **kwargs)


def validate(config: Any, fields: Sequence[Any]) -> None:
    """Check every declared field of ``config`` by its kind or check function (in place:
    a check may return the value normalised)."""
    for f in fields:
        value = getattr(config, f.name)
        if value is None:
            continue
        meta = f.metadata
        label = flag_of(f) or f.name        # (fit's errors say its keyword: flag_words.py)
        if meta.get("kind") is not None:
            value = meta["kind"].check(label, value)
        if meta.get("check") is not None:
            value = meta["check"](value)
        object.__setattr__(config, f.name, value)


def whole_number(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``least``, or a one-line error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {value}")
        return value
    return parse


def positive_number(text: str) -> float:
    """An argparse type: a finite number > 0, or a one-line error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value
