import gzip
import struct

import numpy as np
import pytest
import torch

from dptrain.data.idx import IMAGES_MAGIC, LABELS_MAGIC, IDXError, decompress, parse_idx, read_idx


def idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def test_images_and_labels_round_trip(tmp_path):
    images = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    labels = np.array([7, 1])
    (tmp_path / "img.gz").write_bytes(gzip.compress(idx_bytes(images)))
    (tmp_path / "lab").write_bytes(idx_bytes(labels))
    got = read_idx(tmp_path / "img.gz", IMAGES_MAGIC)
    assert got.dtype == torch.uint8 and got.shape == (2, 3, 4)
    assert torch.equal(got, torch.from_numpy(images.astype(np.uint8)))
    assert read_idx(tmp_path / "lab", LABELS_MAGIC).tolist() == [7, 1]


def test_wrong_magic_names_what_was_expected():
    with pytest.raises(IDXError, match="IDX magic is 2049, expected 2051 .images."):
        parse_idx(idx_bytes(np.array([1, 2])), "f", IMAGES_MAGIC)


def test_truncated_file():
    data = idx_bytes(np.zeros((3, 2, 2)))
    with pytest.raises(IDXError, match=r"truncated: header says shape \(3, 2, 2\) \(28 bytes\), file has 27"):
        parse_idx(data[:-1], "f")
    with pytest.raises(IDXError, match="truncated IDX header"):
        parse_idx(data[:9], "f")
    with pytest.raises(IDXError, match="too short for an IDX header"):
        parse_idx(b"\x00\x00", "f")


def test_trailing_bytes():
    with pytest.raises(IDXError, match="has trailing bytes"):
        parse_idx(idx_bytes(np.zeros(4)) + b"x", "f")


def test_not_an_idx_file():
    with pytest.raises(IDXError, match="not an IDX file"):
        parse_idx(b"<html>oops</html>", "f")


def test_corrupt_and_truncated_gzip():
    packed = gzip.compress(idx_bytes(np.zeros((5, 5))))
    with pytest.raises(IDXError, match="corrupt or truncated gzip"):
        decompress(packed[: len(packed) // 2], "f.gz")
    broken = packed[:12] + bytes(b ^ 0xFF for b in packed[12:20]) + packed[20:]
    with pytest.raises(IDXError, match="corrupt or truncated gzip"):
        decompress(broken, "f.gz")
