"""Read IDX files (the MNIST format), plain or gzipped, by parsing the header.

Header: two zero bytes, a type code (0x08 = unsigned byte), the number of dimensions, then
one big-endian uint32 per dimension. Images are magic 2051 (0x0803, 3 dims), labels 2049
(0x0801, 1 dim).
"""
from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from ..core.errors import IDXError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
           0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}



def decompress(raw: bytes, name: str = "data") -> bytes:
    """Return ``raw`` gunzipped if it is gzip (magic 1f 8b), else unchanged."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise IDXError(f"{name}: corrupt or truncated gzip data ({e}); delete the file and "
                       f"download it again") from None


def parse_idx(data: bytes, name: str = "data", expect_magic: Optional[int] = None) -> torch.Tensor:
    """Parse decompressed IDX bytes into a tensor of the shape its header gives."""
    if len(data) < 4:
        raise IDXError(f"{name}: {len(data)} bytes is too short for an IDX header (needs 4+)")
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    magic = (code << 8) | ndim
    if zero != 0 or code not in _DTYPES or ndim == 0:
        raise IDXError(f"{name}: not an IDX file (first bytes {data[:4].hex()}, expected magic "
                       f"{expect_magic or '2051 or 2049'})")
    if expect_magic is not None and magic != expect_magic:
        raise IDXError(f"{name}: IDX magic is {magic}, expected {expect_magic} "
                       f"({'images' if expect_magic == IMAGES_MAGIC else 'labels'}); "
                       f"is the file name right?")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IDXError(f"{name}: truncated IDX header ({len(data)} bytes, needs {header})")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_DTYPES[code])
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise IDXError(f"{name}: IDX file {what}: header says shape {tuple(dims)} "
                       f"({expected} bytes), file has {len(data)} bytes; download it again")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))


def read_idx(path: Union[str, Path], expect_magic: Optional[int] = None) -> torch.Tensor:
    """Read an IDX file (``.gz`` or not) from disk."""
    path = Path(path)
    return parse_idx(decompress(path.read_bytes(), str(path)), str(path), expect_magic)
