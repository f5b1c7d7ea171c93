"""make_loader: which loader for what the user gave (``data/choose_loader.py``)."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import dptrain
from dptrain.data import DatasetLoader, TensorLoader, make_loader
from dptrain.data.stream_loader import StreamLoader
from tests.data.test_dataset_loader import Indexed


def test_make_loader_picks_the_loader():
    X, y = torch.randn(10, 2), torch.arange(10)
    assert isinstance(make_loader(TensorDataset(X, y), 4), TensorLoader)
    assert isinstance(make_loader((X.numpy(), y.numpy()), 4), TensorLoader)
    assert isinstance(make_loader(Indexed(3), 4), DatasetLoader)
    wrapped = make_loader(DataLoader(Indexed(6), batch_size=99, collate_fn=lambda s: len(s)), 4)
    assert isinstance(wrapped, DatasetLoader) and list(wrapped) == [4, 2]     # its collate, our batch size
    samples = [(X[k], int(y[k])) for k in range(10)]        # a DataLoader over a list of samples: read one by one
    listed = make_loader(DataLoader(samples, batch_size=4), 4, shuffle=False)    # (was: tensors, and failed)
    assert isinstance(listed, DatasetLoader)
    assert [b[1].tolist() for b in listed] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    class Stream(IterableDataset):
        def __iter__(self):
            yield 1
    assert isinstance(make_loader(Stream(), 4), StreamLoader)          # read in its order (test_stream_loader.py)
    with pytest.raises(TypeError, match="not a map-style Dataset"):
        DatasetLoader(Stream(), 4)
    with pytest.raises(ValueError, match="num_workers applies to a Dataset"):
        make_loader((X, y), 4, num_workers=2)


def test_a_list_of_samples_is_a_dataset_as_a_dataloader_takes_it_and_tensors_stay_columns():
    X, y = torch.randn(10, 2), torch.arange(10)
    lists = {"pairs": [(X[k], int(y[k])) for k in range(10)],
             "dicts": [{"x": X[k], "y": y[k]} for k in range(10)],          # (was: "no batch axis")
             "sample tensors": [X[k] for k in range(10)],                   # (was: 10 columns of 2 samples)
             "0-d tensors": list(y)}
    for name, samples in lists.items():
        loader = make_loader(samples, 4, shuffle=False)
        assert isinstance(loader, DatasetLoader), name
        batches = list(loader)
        assert len(batches) == 3 and len(loader) == 3, name
        first = batches[0]
        got = first["x"] if name == "dicts" else first[0] if name == "pairs" else first
        assert torch.equal(got, X[:4] if name != "0-d tensors" else y[:4]), name
    lengths = [torch.ones(k) for k in (3, 5, 2)]            # sequences of their own lengths: samples too
    assert isinstance(make_loader(lengths, 2, collate_fn=lambda s: len(s)), DatasetLoader)
    for columns in ((X, y), [X, y], (X.numpy(), y.numpy()), ((X, X), y), (X, {"a": X, "b": (y, y)})):
        loader = make_loader(columns, 4, shuffle=False)
        assert isinstance(loader, TensorLoader) and len(loader) == 3


def test_numpy_arrays_give_batches_of_the_right_shape():
    X, y = np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5)
    batches = list(make_loader((X, y), 2))
    assert [tuple(b[0].shape) for b in batches] == [(2, 2), (2, 2), (1, 2)]
    assert isinstance(batches[-1][1], torch.Tensor)


def test_a_list_of_whole_batches_is_an_error_giving_both_readings_and_the_fix_trains():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(256, 8, generator=g), torch.randint(0, 2, (256,), generator=g)
    batches = [(X[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]      # (what list(DataLoader(...)) gives)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    for call in (lambda: dptrain.fit(model, batches, epochs=1, log=None, progress=False),
                 lambda: dptrain.evaluate(model, batches, devices=1)):
        with pytest.raises(ValueError, match=r"the data is a list of 8 items, each a tuple of the same make, which "
                                             r"would be read as 8 columns .* if each item is a batch, give "
                                             r"DataLoader\(items, batch_size=None\)"):
            call()
    stepped = dptrain.fit(model, torch.utils.data.DataLoader(batches, batch_size=None), epochs=1, log=None,
                          progress=False, devices=1)
    assert stepped["history"][-1]["batches"] == 8
    for fine in ([X, y], [(X[i], y[i]) for i in range(256)]):     # columns, samples
        assert "test_loss" in dptrain.evaluate(model, fine, devices=1)
    assert isinstance(make_loader((X[:, :4], X[:, 4:], y), 32), TensorLoader)      # three columns: no batches


def test_a_column_given_as_a_python_list_is_a_tensor_column():
    """``(X, labels)`` with the labels a list (appended in a loop; Keras takes them) was read as
    two samples and failed in torch's collate ("stack expects each tensor to be equal size")."""
    import copy

    from dptrain.data.choose_loader import lists_as_columns
    X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    labels = [int(v > 0) for v in X[:, 0]]
    columns = lists_as_columns((X, labels))
    assert isinstance(columns, tuple) and torch.equal(columns[1], torch.tensor(labels))
    assert columns[1].dtype == torch.int64 and lists_as_columns((X, [0.5] * 40))[1].dtype == torch.float32
    samples = [(X[i], labels[i]) for i in range(40)]
    assert lists_as_columns(samples) is samples             # (a list of samples, as it was)
    short = (X, labels[:39])
    assert lists_as_columns(short) is short                 # (rows that differ: as it was, the loader's error)
    torch.manual_seed(0)
    base = torch.nn.Linear(3, 2)
    fitted = []
    for y in (labels, np.array(labels)):
        model = copy.deepcopy(base)
        result = dptrain.fit(model, (X, y), (X, y), epochs=1, batch_size=8, devices=2, log=None, shuffle=False)
        fitted.append((model.weight.detach().clone(), result["test_acc"]))
    assert torch.equal(fitted[0][0], fitted[1][0]) and fitted[0][1] == fitted[1][1]
    assert dptrain.evaluate(model, (X, labels), devices=1)["test_acc"] == fitted[1][1]
