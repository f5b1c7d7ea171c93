"""NumPy's float64 data and a float32 model: the error names the arrays and both fixes, the
user's error chained; nothing is cast (a model reading float64 on purpose gets float64)."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import dptrain
from dptrain.run.float64_data import float64_arrays


def arrays(n=48):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 5))                   # float64, as NumPy and pandas give
    return X, (X[:, 0] > 0).astype(np.int64)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))


@pytest.mark.parametrize("call", ["fit", "evaluate", "predict"])
def test_float64_arrays_with_a_float32_model_name_the_arrays_and_the_fixes(call):
    X, y = arrays()
    model = net()
    before = [p.detach().clone() for p in model.parameters()]
    run = {"fit": lambda: dptrain.fit(model, (X, y), epochs=1, batch_size=16, devices=2, log=None),
           "evaluate": lambda: dptrain.evaluate(model, (X, y), devices=2),
           "predict": lambda: dptrain.predict(model, X, devices=2)}[call]
    with pytest.raises(TypeError, match=r"the data's X is float64 \(NumPy's default\) and the model's parameters "
                                        r"float32: give float32 data \(X.astype\(np.float32\).*model.double\(\)") as e:
        run()
    assert isinstance(e.value.__cause__, RuntimeError) and "Double" in str(e.value.__cause__)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_nothing_is_cast_a_model_reading_float64_on_purpose_trains():
    class Casts(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.seen = net(), set()

        def forward(self, x):
            self.seen.add(x.dtype)
            return self.inner(x.float())

    X, y = arrays()
    model = Casts()
    result = dptrain.fit(model, (X, y), epochs=1, batch_size=16, devices=2, log=None)
    assert model.seen == {torch.float64} and result["history"]
    X32 = X.astype(np.float32)
    fine = dptrain.fit(net(), (X32, y), epochs=1, batch_size=16, devices=1, log=None)
    assert fine["history"]


def test_the_float64_arrays_are_named_where_they_are_given():
    X, y = arrays()
    t = torch.from_numpy(X)
    assert float64_arrays([(X, y)]) == ["X"]
    assert float64_arrays([X]) == ["X"]
    assert float64_arrays([{"x": X, "w": t, "y": y}]) == ["'x'", "'w'"]
    assert float64_arrays([DataLoader(TensorDataset(t.float(), t), batch_size=4)]) == ["y"]
    assert float64_arrays([(X.astype(np.float32), y), None]) == []

    class Rows(Dataset):            # a Dataset of one's own over NumPy's arrays
        def __init__(self):
            self.X, self.y, self._cache = X, y, X

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.X[i], self.y[i]
    assert float64_arrays([Rows()]) == ["Rows.X"]

    class Converts(Rows):           # ... or converting its rows as it reads them
        def __init__(self):
            self.rows = [list(map(float, x)) for x in X]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return torch.tensor(self.rows[i], dtype=torch.float64), 1
    assert float64_arrays([Converts()]) == ["Converts[0][0]"]
    with pytest.raises(TypeError, match=r"the data's Rows.X is float64"):
        dptrain.fit(net(), Rows(), epochs=1, batch_size=16, devices=1, log=None)
