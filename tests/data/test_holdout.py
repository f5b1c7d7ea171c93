"""``validation_split``: the last samples held out as the evaluation set, Keras's rule, for every
kind of data ``fit`` takes (``data/holdout.py``)."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

import dptrain
from dptrain.data.holdout import hold_out

torch.set_num_threads(1)


class Numbered(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)]), torch.tensor(i % 3)


def test_keras_rule_the_first_floor_n_times_1_minus_f_train_and_the_rest_is_held_out():
    X, y = torch.arange(10.0).reshape(10, 1), torch.arange(10)
    for fraction, keep in ((0.1, 9), (0.25, 7), (0.5, 5), (0.9, 1), (0.7, 3)):
        (tx, ty), (hx, hy) = hold_out((X, y), fraction)
        assert ty.tolist() == list(range(keep)) and hy.tolist() == list(range(keep, 10)), fraction
        assert tx.data_ptr() == X.data_ptr()                 # a view, not a copy


@pytest.mark.parametrize("kind", ["dict", "numpy", "tensor-dataset", "dataset", "dataloader"])
def test_every_kind_of_data_is_split_the_same_way(kind):
    n = 10
    X, y = torch.arange(float(n)).reshape(n, 1), torch.arange(n) % 3
    data = {"dict": {"x": X, "y": y}, "numpy": (X.numpy(), y.numpy()), "tensor-dataset": TensorDataset(X, y),
            "dataset": Numbered(n), "dataloader": DataLoader(Numbered(n), batch_size=4, collate_fn=None)}[kind]
    train, held = hold_out(data, 0.3)
    if kind == "dict":
        assert held["x"].flatten().tolist() == [7.0, 8.0, 9.0] and len(train["y"]) == 7
    elif kind == "numpy":
        assert isinstance(held[0], np.ndarray) and held[0].flatten().tolist() == [7.0, 8.0, 9.0]
    elif kind == "tensor-dataset":
        assert isinstance(held, TensorDataset) and held.tensors[0].flatten().tolist() == [7.0, 8.0, 9.0]
    else:
        parts = (train.dataset, held.dataset) if kind == "dataloader" else (train, held)
        assert [float(parts[1][i][0]) for i in range(len(parts[1]))] == [7.0, 8.0, 9.0]
        assert len(parts[0]) == 7
        if kind == "dataloader":
            assert held.batch_size == 4 and held.collate_fn is data.collate_fn


def test_fit_with_validation_split_is_fit_with_that_evaluation_set():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(200, 5, generator=g), torch.randint(0, 3, (200,), generator=g)
    rows = []
    for split in (True, False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
        data = (X, y) if split else (X[:150], y[:150])
        result = dptrain.fit(model, data, None if split else (X[150:], y[150:]), epochs=2, batch_size=16,
                             devices=2, log=None, **({"validation_split": 0.25} if split else {}))
        rows.append([{k: v for k, v in r.items() if k != "sec"} for r in result["history"]])
    assert rows[0] == rows[1] and "test_acc" in rows[0][0]


def test_wrong_uses_are_named_with_the_fix():
    X, y = torch.randn(10, 2), torch.randint(0, 2, (10,))
    with pytest.raises(ValueError, match="validation_split must be a fraction between 0 and 1"):
        dptrain.fit(nn.Linear(2, 2), (X, y), validation_split=1.5, log=None)
    with pytest.raises(ValueError, match="both an evaluation set and validation_split were given: give one"):
        dptrain.fit(nn.Linear(2, 2), (X, y), (X, y), validation_split=0.2, devices=1, log=None)
    with pytest.raises(ValueError, match="validation_split=1e-12 of 10 training samples leaves no evaluation sample"):
        hold_out((X, y), 1e-12)
    with pytest.raises(ValueError, match="validation_split=0.95 of 10 training samples leaves no training sample"):
        hold_out((X, y), 0.95)
    with pytest.raises(ValueError, match="the tensors have different lengths"):
        hold_out((X, y[:9]), 0.5)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(())
    with pytest.raises(ValueError, match="an IterableDataset has no last samples to hold out: give eval_data"):
        hold_out(Stream(), 0.5)
