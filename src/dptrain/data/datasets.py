"""Load Fashion-MNIST and MNIST into memory as tensors ready for batching."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional, Tuple

import torch

from .idx import IMAGES_MAGIC, LABELS_MAGIC, IDXError, decompress, parse_idx
from .sources import SOURCES, locate

#: Class names of Fashion-MNIST, by label.
FASHION_LABELS = ("t-shirt", "trouser", "pullover", "dress", "coat",
                  "sandal", "shirt", "sneaker", "bag", "ankle boot")


@dataclass(frozen=True)
class Dataset:
    """Images as float32 NCHW in [0, 1], labels as int64, train and test."""
    name: str
    train_X: torch.Tensor
    train_y: torch.Tensor
    test_X: torch.Tensor
    test_y: torch.Tensor


def _read(path: Path, name: str, magic: int) -> torch.Tensor:
    data = decompress(path.read_bytes(), str(path))
    tensor = parse_idx(data, str(path), magic)
    digest = hashlib.sha256(data).hexdigest()
    if digest != SOURCES[name].sha256[path.name]:
        raise IDXError(f"{path}: content differs from the official {name} file {path.name} "
                       f"(sha256 {digest[:12]}...); is it another dataset, or corrupt? "
                       f"Delete it or point --data-dir at the right folder")
    return tensor


def _images(raw: torch.Tensor) -> torch.Tensor:
    # Scaled once at load time: batches are then plain index gathers, no per-sample Python.
    return raw.unsqueeze(1).float().div_(255.0)


@lru_cache(maxsize=4)
def _load(name: str, paths: Tuple[Tuple[str, Path], ...]) -> Dataset:
    p = dict(paths)
    train_X = _read(p["train-images-idx3-ubyte.gz"], name, IMAGES_MAGIC)
    train_y = _read(p["train-labels-idx1-ubyte.gz"], name, LABELS_MAGIC)
    test_X = _read(p["t10k-images-idx3-ubyte.gz"], name, IMAGES_MAGIC)
    test_y = _read(p["t10k-labels-idx1-ubyte.gz"], name, LABELS_MAGIC)
    for split, X, y in (("train", train_X, train_y), ("test", test_X, test_y)):
        if len(X) != len(y):
            raise IDXError(f"{name} {split}: {len(X)} images but {len(y)} labels")
    return Dataset(name, _images(train_X), train_y.long(), _images(test_X), test_y.long())


def load_dataset(name: str = "fashion-mnist", data_dir: Optional[str] = None,
                 allow_download: bool = True) -> Dataset:
    """Load a dataset by name (``fashion-mnist`` or ``mnist``), from disk or the network.

    >>> ds = load_dataset("fashion-mnist")
    >>> ds.train_X.shape, ds.train_X.dtype, ds.test_y[:3]
    (torch.Size([60000, 1, 28, 28]), torch.float32, tensor([9, 2, 1]))
    """
    paths = locate(name, data_dir, allow_download)
    return _load(name, tuple(sorted(paths.items())))
