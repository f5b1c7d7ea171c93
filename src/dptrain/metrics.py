"""``--metrics FILE.jsonl``: one JSON record per epoch, appended and flushed to disk."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Union


class MetricsLog:
    """Append one line per record; each line is complete on disk before the next epoch starts."""

    def __init__(self, path: Union[str, Path]):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a"):
                pass
        except OSError as e:
            raise ValueError(f"cannot write the metrics file {self.path}: {e.strerror}; "
                             f"pick a writable path for --metrics") from None

    def append(self, record: Dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """The records of a metrics file; a line cut short by a crash is skipped."""
    records = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read metrics file {path}: {e.strerror}") from None
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not records:
        raise ValueError(f"{path} holds no metrics records (one JSON object per line expected)")
    return records
