"""``--metrics FILE.jsonl``: one JSON record per epoch, written and flushed to disk as it ends;
``--metrics FILE.csv``: the same records as a table (Keras's and Lightning's ``CSVLogger``),
a column for every figure any epoch had, rewritten whole and atomically each epoch (a figure
that comes later, a test figure of ``eval_every``, gets its column then; a cell without a value
is empty).

A file holds one run: a new run starts it (``--overwrite`` replaces another run's records,
which are otherwise refused before training, see ``preflight.py``); a resumed run rewrites
it with the checkpoint's epochs, then goes on, so a crash between a record and a checkpoint
never leaves an epoch twice or missing.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Union

from ..core.atomic import atomic_file

REQUIRED = ("epoch", "train_loss")


def is_csv(path: Union[str, Path]) -> bool:
    return Path(path).suffix.lower() == ".csv"


def csv_text(records: List[Dict[str, Any]]) -> str:
    """``records`` as CSV: a header of every key in the order first seen; numbers as Python
    writes them (they read back equal), lists and dicts as JSON (and a string that would read
    back as another thing), no value an empty cell."""
    columns = list(dict.fromkeys(k for record in records for k in record))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow([_text(record.get(k)) for k in columns])
    return out.getvalue()


def _text(value: Any) -> Any:
    """A cell's text: none for None; JSON for lists, dicts, booleans, and for a string that
    would read back as something else (``"12"``, ``"nan"``, ``""``)."""
    if value is None:
        return ""
    if isinstance(value, (list, dict, bool)) or (isinstance(value, str) and (value == "" or _cell(value) != value)):
        return json.dumps(value)
    return value


def _cell(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[:1] in '[{"' or text in ("true", "false"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def csv_records(text: str) -> List[Dict[str, Any]]:
    """The records of ``csv_text``'s table (an empty cell: no such figure that epoch)."""
    return [{k: _cell(v) for k, v in row.items() if v != ""} for row in csv.DictReader(io.StringIO(text))]


class MetricsLog:
    """Append one line per record; each line is complete on disk before the next epoch starts
    (a ``.csv`` file: the whole table, atomically).

    ``start``: the records the file begins with (a resumed run's history), replacing what
    it held."""

    def __init__(self, path: Union[str, Path], start: Iterable[Dict[str, Any]] = ()):
        self.path = Path(path)
        self.records: List[Dict[str, Any]] = []         # (a CSV file's, rewritten whole)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write("w", start)
        except OSError as e:
            raise ValueError(f"cannot write the metrics file {self.path}: {e.strerror}; "
                             f"pick a writable path for --metrics") from None

    def append(self, record: Dict[str, Any]) -> None:
        try:
            self._write("a", [record])
        except OSError as e:
            raise ValueError(f"could not write to the metrics file {self.path}: {e.strerror} (the records before "
                             f"this epoch are kept); free some space or pick another --metrics file") from None

    def _write(self, mode: str, records) -> None:
        """The records, one JSON line each, on the disk before this returns."""
        if is_csv(self.path):
            self.records = (self.records if mode == "a" else []) + list(records)
            with atomic_file(self.path) as f:
                f.write(csv_text(self.records).encode("utf-8"))
            return
        with open(self.path, mode) as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """The records of a metrics file; a last line cut short by a crash is skipped, anything
    else that is not a record is a one-line error naming the line."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ValueError(f"cannot read metrics file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a metrics file (binary content; --metrics writes JSON lines)") from None
    if is_csv(path):
        records = csv_records(text)
        if not records or any(k not in records[0] for k in REQUIRED):
            raise ValueError(f"{path} holds no metrics records (a table with columns {', '.join(REQUIRED)}, ... "
                             f"expected)")
        return records
    lines = text.splitlines()
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):          # the last line, cut short by a crash
                continue
            raise ValueError(f"{path}, line {n}: not JSON; a metrics file holds one JSON object per line") from None
        missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
        if missing:
            what = type(record).__name__ if not isinstance(record, dict) else f"a record without {', '.join(missing)}"
            raise ValueError(f"{path}, line {n}: {what}, not an epoch record (--metrics writes objects with "
                             f"{', '.join(REQUIRED)}, ...)")
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no metrics records (one JSON object per line expected)")
    return records
