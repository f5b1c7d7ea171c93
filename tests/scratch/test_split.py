import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dptrain
from dptrain.scratch.split import shard_sizes


def devices(k):
    return [dptrain.cpu(i) for i in range(k)]


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), k=st.integers(1, 8), even=st.booleans())
def test_every_sample_lands_on_exactly_one_device_in_order(n, k, even):
    if n < k or (even and n % k):
        with pytest.raises(ValueError):
            dptrain.split_and_load(torch.arange(n), devices(k), even_split=even)
        return
    parts = dptrain.split_and_load(torch.arange(n), devices(k), even_split=even)
    assert len(parts) == k
    assert torch.equal(torch.cat(parts), torch.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_reference_example():
    data = torch.arange(24).reshape(4, 6)
    a, b = dptrain.split_and_load(data, devices(2))
    assert torch.equal(a, data[:2]) and torch.equal(b, data[2:])


def test_split_batch_keeps_samples_and_labels_together():
    X = torch.arange(10).float().reshape(10, 1) * 100
    y = torch.arange(10)
    Xs, ys = dptrain.split_batch(X, y, devices(3), even_split=False)
    for Xp, yp in zip(Xs, ys):
        assert torch.equal(Xp[:, 0], yp.float() * 100)


def test_uneven_sizes_give_the_extra_samples_to_the_first_devices():
    assert shard_sizes(10, 3, even_split=False) == [4, 3, 3]
    assert shard_sizes(12, 3) == [4, 4, 4]


@pytest.mark.parametrize("call, message", [
    (lambda: dptrain.split_and_load(torch.arange(3), devices(4)),
     "at least as many samples as devices, got 3 samples for 4 devices"),
    (lambda: dptrain.split_and_load(torch.arange(10), devices(4)),
     r"cannot split 10 samples evenly over 4 devices .*pass even_split=False"),
    (lambda: dptrain.split_and_load(torch.arange(10), []), "the device list is empty"),
    (lambda: dptrain.split_batch(torch.zeros(4, 2), torch.zeros(5), devices(2)),
     "X and y must have the same number of samples, got 4 and 5"),
    (lambda: dptrain.split_and_load(torch.tensor(1.0), devices(1)), "0-d tensor"),
])
def test_bad_input_says_what_to_do(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_split_and_load_needs_a_tensor():
    with pytest.raises(TypeError, match="needs a torch.Tensor, got list"):
        dptrain.split_and_load([1, 2], devices(2))
