"""The training data made to carry Keras's ``sample_weight`` in its batches, last."""
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from dptrain.data.sample_weights import (WEIGHT_KEY, WeightedSamples, WeightsLast, as_weights, weighed,
                                        weights_carried, weights_for)


def test_columns_a_tensor_dataset_and_a_dict_get_the_weights_as_their_last_column():
    X, y, w = torch.randn(6, 2), torch.arange(6), torch.rand(6)
    data, collate = weighed((X, y), w, None)
    assert collate is None and len(data) == 3 and torch.equal(data[2], w)
    data, _ = weighed(TensorDataset(X, y), w, None)
    assert isinstance(data, TensorDataset) and torch.equal(data.tensors[2], w)
    data, _ = weighed({"x": X, "labels": y}, w, None)
    assert list(data) == ["x", "labels", WEIGHT_KEY] and torch.equal(data[WEIGHT_KEY], w)
    data, _ = weighed((X[:4], y[:4]), w, None)          # (validation_split's training part: the first rows')
    assert torch.equal(data[2], w[:4])
    assert weighed((X, y), True, None) == ((X, y), None)        # (the batches carry them)


def test_a_dataset_of_samples_is_collated_as_before_with_the_weights_put_last():
    samples = [(torch.tensor([float(i)]), i) for i in range(5)]
    w = torch.arange(5.0) / 2
    data, collate = weighed(samples, w, None)
    assert isinstance(data, WeightedSamples) and isinstance(collate, WeightsLast)
    x, y, weights = collate([data[i] for i in (4, 1)])
    assert torch.equal(x, torch.tensor([[4.0], [1.0]])) and torch.equal(y, torch.tensor([4, 1]))
    assert torch.equal(weights, torch.tensor([2.0, 0.5]))
    as_dict = WeightsLast(lambda batch: {"x": torch.stack([s[0] for s in batch])}, torch.float32)
    assert torch.equal(as_dict([data[0], data[2]])[WEIGHT_KEY], torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="its collate function made a Tensor: let it return"):
        WeightsLast(lambda batch: torch.zeros(len(batch)), torch.float32)([data[0]])


def test_weights_are_read_from_lists_arrays_and_tensors_and_checked():
    assert as_weights([1, 2, 3], 3).dtype == torch.get_default_dtype()     # (integers: floats)
    assert torch.equal(as_weights(np.ones((3, 1)), 3), torch.ones(3, dtype=torch.float64))     # (Keras's (N, 1))
    with pytest.raises(ValueError, match=r"sample_weight\[1\] is nan"):
        as_weights([1.0, float("nan")], 2)
    with pytest.raises(TypeError, match="sample_weight's weights are numbers, got torch.bool"):
        as_weights(torch.ones(2, dtype=torch.bool), 2)
    with pytest.raises(TypeError, match="sample_weight is one weight a training sample .*got str"):
        weights_for((torch.zeros(2, 1), torch.zeros(2)), "balanced")


def test_an_evaluation_set_with_one_column_more_than_a_training_sample_carries_its_weights():
    X, y, w = torch.randn(6, 2), torch.arange(6), np.linspace(0.0, 1.0, 6)
    assert torch.equal(weights_carried((X, y, w), 2), torch.from_numpy(w))
    assert torch.equal(weights_carried([X, y, w.reshape(6, 1)], 2), weights_carried((X, y, w), 2))   # (Keras's (N, 1))
    assert weights_carried((X, y, w), 3) is None            # (x1, x2, y) of a model of two inputs
    assert weights_carried((X, y), 2) is None and weights_carried((X, y, w), None) is None
    assert weights_carried((X, y, X), 2) is None            # not one number a sample
    assert weights_carried((X, y, w[:5]), 2) is None        # not one a sample
    assert weights_carried([(X[0], y[0], 1.0)] * 3, 2) is None      # a list of samples, not columns
