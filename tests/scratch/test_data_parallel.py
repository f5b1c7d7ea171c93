"""N-device from-scratch training equals 1-device training on the same global batch."""
import pytest
import torch

import dptrain
from dptrain.models import lenet, lenet_params
from dptrain.scratch.data_parallel import ScratchDataParallel, get_params


def batch(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def run(n_devices, algorithm, steps=2, n=24):
    params = lenet_params(scale=0.1, generator=torch.Generator().manual_seed(0))
    dp = ScratchDataParallel(lenet, params, [dptrain.cpu(i) for i in range(n_devices)], allreduce=algorithm)
    losses = [dp.train_batch(*batch(n, seed=s), lr=0.5).item() for s in range(steps)]
    return dp, losses


@pytest.mark.parametrize("algorithm", ["naive", "ring"])
@pytest.mark.parametrize("n_devices", [2, 3])
def test_n_devices_match_one_device(n_devices, algorithm):
    one, loss_one = run(1, "naive")
    many, loss_many = run(n_devices, algorithm)
    assert loss_many == pytest.approx(loss_one, rel=1e-5)
    for rep in many.replicas:
        for p, q in zip(rep, one.replicas[0]):
            torch.testing.assert_close(p, q)


def test_uneven_shards_are_weighted_by_the_full_batch():
    one, _ = run(1, "naive", steps=1, n=10)
    many, _ = run(3, "ring", steps=1, n=10)      # shards of 4, 3, 3
    for p, q in zip(many.replicas[2], one.replicas[0]):
        torch.testing.assert_close(p, q)


def test_training_changes_the_parameters():
    params = lenet_params(scale=0.1, generator=torch.Generator().manual_seed(0))
    dp = ScratchDataParallel(lenet, params, [dptrain.cpu(0), dptrain.cpu(1)])
    dp.train_batch(*batch(), lr=0.5)
    assert not torch.equal(dp.replicas[0][0], params[0])


def test_get_params_makes_distinct_leaf_copies():
    params = lenet_params()
    a, b = get_params(params, dptrain.cpu(0)), get_params(params, dptrain.cpu(1))
    assert all(x.is_leaf and x.requires_grad for x in a)
    a[0].data.add_(1.0)
    assert not torch.equal(a[0], b[0]) and not torch.equal(a[0], params[0])


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'star'"):
        ScratchDataParallel(lenet, lenet_params(), [dptrain.cpu(0)], allreduce="star")
