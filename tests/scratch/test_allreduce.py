import pytest
import torch

import dptrain
from dptrain.scratch.allreduce import ALGORITHMS


def make(n, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(1,), (2,), (3,), (7,), (5, 3), (128, 10), (20, 1, 3, 3), (1001,)])
def test_every_tensor_ends_with_the_sum(algorithm, n, shape):
    tensors = make(n, shape)
    expected = torch.stack(tensors).sum(0)
    out = dptrain.allreduce(tensors, algorithm=algorithm)
    assert out is not None and len(out) == n
    for t in tensors:                      # in place
        torch.testing.assert_close(t, expected)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_agrees_with_naive(n):
    a, b = make(n, (257, 3), seed=1), make(n, (257, 3), seed=1)
    dptrain.allreduce(a, "naive")
    dptrain.allreduce(b, "ring")
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


def test_reference_example():
    data = [torch.ones(1, 2) * (i + 1) for i in range(2)]
    dptrain.allreduce(data)
    assert data[0].tolist() == [[3.0, 3.0]] and data[1].tolist() == [[3.0, 3.0]]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_non_contiguous_tensors(algorithm):
    tensors = [t.t() for t in make(3, (4, 6))]
    expected = torch.stack(tensors).sum(0)
    dptrain.allreduce(tensors, algorithm)
    for t in tensors:
        torch.testing.assert_close(t, expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_empty_tensors(algorithm):
    tensors = [torch.zeros(0) for _ in range(3)]
    dptrain.allreduce(tensors, algorithm)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'tree'; choose one of naive, ring"):
        dptrain.allreduce([torch.ones(1)], "tree")
    with pytest.raises(ValueError, match=r"one shape and dtype: tensor 0 is \(2,\) torch.float32, tensor 1 is \(3,\)"):
        dptrain.allreduce([torch.ones(2), torch.ones(3)])
    with pytest.raises(ValueError, match="at least one tensor"):
        dptrain.allreduce([])
