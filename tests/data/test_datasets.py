import shutil

import pytest
import torch

from dptrain.data import IDXError, load_dataset


def test_fashion_mnist_loads_as_scaled_nchw(data_dir):
    ds = load_dataset("fashion-mnist", data_dir)
    assert ds.train_X.shape == (60000, 1, 28, 28) and ds.test_X.shape == (10000, 1, 28, 28)
    assert ds.train_X.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert 0.0 <= ds.train_X.min() and ds.train_X.max() <= 1.0 and ds.train_X.max() > 0.99
    assert torch.bincount(ds.train_y).tolist() == [6000] * 10
    assert ds.test_y[:3].tolist() == [9, 2, 1]     # ankle boot, pullover, trouser


def test_mnist_loads(data_dir):
    ds = load_dataset("mnist", data_dir)
    assert ds.train_y[:5].tolist() == [5, 0, 4, 1, 9]


def test_a_file_of_another_dataset_is_refused(data_dir, tmp_path):
    # MNIST files under the Fashion-MNIST names: well-formed IDX, wrong content.
    shutil.copytree(f"{data_dir}/mnist", tmp_path / "fashion-mnist")
    with pytest.raises(IDXError, match="content differs from the official fashion-mnist file"):
        load_dataset("fashion-mnist", str(tmp_path))


def test_a_truncated_file_is_a_clear_error(data_dir, tmp_path):
    shutil.copytree(f"{data_dir}/fashion-mnist", tmp_path / "fashion-mnist")
    target = tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz"
    target.write_bytes(target.read_bytes()[:-100])
    with pytest.raises(IDXError, match="t10k-labels-idx1-ubyte.gz: corrupt or truncated gzip"):
        load_dataset("fashion-mnist", str(tmp_path))
