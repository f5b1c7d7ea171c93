"""What every process must hold alike, described before the run: the data's fingerprint."""
import numpy as np
import torch
from torch import nn

import dptrain
from dptrain.data.choose_loader import make_loader
from dptrain.run.agreement import fingerprint


def test_a_numpy_column_of_stride_zero_is_fingerprinted_as_its_copy_and_trains():
    """Keras's labels ``y[:, None]`` (NumPy gives the new axis stride 0, which torch counts as
    contiguous): the fingerprint's view of a row as bytes was an error ("self.stride(-1) must be 1 to
    view Float as Byte"), raised while setting up every run."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.float32)
    column = y[:, None]
    assert torch.as_tensor(column).stride() == (1, 0)
    copied = np.ascontiguousarray(y.reshape(-1, 1))
    assert fingerprint(make_loader((X, column), 8, shuffle=False, seed=0)) == \
        fingerprint(make_loader((X, copied), 8, shuffle=False, seed=0))
    assert fingerprint(make_loader((X, column), 8, shuffle=False, seed=0)) != \
        fingerprint(make_loader((X, 1 - copied), 8, shuffle=False, seed=0))
    weights = []
    for labels in (column, copied):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        dptrain.fit(model, (X, labels), loss="bce", epochs=1, batch_size=8, devices=1, log=None)
        weights.append(model.weight.detach().clone())
    assert torch.equal(weights[0], weights[1])
