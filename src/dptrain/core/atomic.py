"""Write a file so that readers see the old content or the new, never half of it."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Union


class _Writes:
    """A binary file that remembers the first ``OSError`` a write raised.

    torch.save reports a failed write (a full disk) as a RuntimeError from its zip writer
    ("unexpected pos 768 vs 662"); this keeps the real cause to report instead."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.error: Optional[OSError] = None

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@contextmanager
def atomic_file(path: Union[str, Path]) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` when the block ends without an error.

    The data goes to a temp file in the same folder, is fsynced, then renamed over ``path``
    (atomic on POSIX), and the folder is fsynced so the rename survives a power cut. A crash
    at any point leaves ``path`` as it was. A write that failed (a full disk, say) raises
    that ``OSError``, whatever the writer made of it.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    writes: Optional[_Writes] = None
    try:
        with os.fdopen(fd, "wb") as f:
            writes = _Writes(f)
            try:
                yield writes
            except Exception:
                if writes.error is not None:
                    raise writes.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
