"""Write a file so that readers see the old content or the new, never half of it."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Union


@contextmanager
def atomic_file(path: Union[str, Path]) -> Iterator[BinaryIO]:
    """Yield a binary file that replaces ``path`` when the block ends without an error.

    The data goes to a temp file in the same folder, is fsynced, then renamed over ``path``
    (atomic on POSIX), and the folder is fsynced so the rename survives a power cut. A crash
    at any point leaves ``path`` as it was.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
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
