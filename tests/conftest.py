"""Shared fixtures: where the real datasets are, and an environment without stray settings."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "datasets"


def real_data_dir():
    """The folder with the official files: ../shared/datasets, $DPTRAIN_DATA, or Debian's."""
    for root in (SHARED_DATA, Path(os.environ.get("DPTRAIN_DATA", "/nonexistent")), Path("/usr/share/datasets")):
        if (root / "fashion-mnist" / "train-images-idx3-ubyte.gz").is_file():
            return root
    return None


@pytest.fixture
def data_dir():
    root = real_data_dir()
    if root is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs the real datasets in ../shared/datasets")
        pytest.skip("real Fashion-MNIST/MNIST files not found")
    return str(root)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    # No test may read the user's cache or download from the internet.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DPTRAIN_DATA", raising=False)
    monkeypatch.delenv("DPTRAIN_MIRROR", raising=False)
