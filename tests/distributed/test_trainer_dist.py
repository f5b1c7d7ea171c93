"""Two processes train exactly like one process on the same global batches."""
import pytest
import torch

import dptrain
from dptrain.models import GluonLeNet, resnet18
from dptrain.core.parts import even_part
from tests.distributed.helpers import run_workers

STEPS, BATCH = 3, 11          # 11 = shards of 6 and 5: uneven, weighted by size


def global_batches(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(BATCH, 1, 28, 28, generator=g, dtype=torch.float64).to(dtype),
             torch.randint(0, 10, (BATCH,), generator=g)) for _ in range(STEPS)]


def make_model(name, seed):
    torch.manual_seed(seed)
    if name == "lenet-nhwc":
        return GluonLeNet().to(memory_format=torch.channels_last)
    return GluonLeNet() if name == "lenet" else resnet18(10, in_channels=1)


def train(rank, world, name, n_devices, fused, sync_bn=False, dtype=torch.float32):
    torch.set_default_dtype(dtype)
    if isinstance(n_devices, tuple):         # a device count per rank
        n_devices = n_devices[rank]
    devices = [dptrain.cpu(i) for i in range(n_devices)]
    # Each rank builds its model from another seed: rank 0's values must win at setup.
    replicas = dptrain.replicate(make_model(name, seed=rank), devices, sync_batchnorm=sync_bn)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, bucket_cap_mb=0.01)
    assert trainer.world_size == world and trainer.kvstore.name == ("dist" if world > 1 else trainer.kvstore.name)
    for X, y in global_batches(dtype):
        start, size = even_part(len(X), world, rank)
        X, y = X[start:start + size], y[start:start + size]
        k = min(len(X), n_devices)
        Xs, ys = dptrain.split_batch(X, y, devices[:k], even_split=False)
        if fused:
            trainer.step_with(lambda i: replicas.forward_backward_one(i, Xs[i], ys[i]), len(X))
        else:
            replicas.forward_backward(Xs, ys)
            trainer.step(len(X))
        for p in replicas[0].parameters():      # gradients keep the parameters' layout
            assert p.grad is None or p.grad.stride() == p.stride(), (p.shape, p.grad.stride(), p.stride())
    # NumPy arrays: ResNet-18's 11M numbers as Python lists took ~25 s of its test to make, send and compare
    return {n: p.detach().numpy().copy() for n, p in replicas[0].named_parameters()} | \
        {n: b.numpy().copy() for n, b in replicas[0].named_buffers()}


def reference(name, sync_bn=False, dtype=torch.float32):
    """The same training in this (single) process, on one device."""
    try:
        return train(0, 1, name, 1, fused=False, sync_bn=sync_bn, dtype=dtype)
    finally:
        torch.set_default_dtype(torch.float32)


def assert_same(got, want, **tol):
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(torch.as_tensor(got[k]).double(), torch.as_tensor(want[k]).double(), msg=k, **tol)


@pytest.mark.parametrize("n_devices, fused", [(1, False), (1, True), (2, True)])
def test_two_processes_equal_one_process(n_devices, fused):
    want = reference("lenet")
    ranks = run_workers(train, "lenet", n_devices, fused)
    assert_same(ranks[0], want, rtol=1e-5, atol=1e-6)
    assert_same(ranks[1], ranks[0], rtol=0, atol=0)


def test_resnet18_with_sync_batchnorm_two_processes_equal_one():
    """In float64, where rounding cannot hide a wrong statistic (see tests/parallel/test_trainer.py)."""
    want = reference("resnet", sync_bn=True, dtype=torch.float64)
    ranks = run_workers(train, "resnet", 1, True, True, torch.float64)
    assert_same(ranks[0], want, rtol=1e-6, atol=1e-9)     # per-device statistics: off by ~1e-2
    assert_same(ranks[1], ranks[0], rtol=0, atol=0)


@pytest.mark.parametrize("n_devices", [1, (1, 2)])
def test_channels_last_parameters_two_processes_equal_one(n_devices):
    """NHWC parameters: the buckets hold their gradients in that layout, also when one rank
    packs through its replicas (2 devices) and the other uses views into the buckets (1)."""
    want = reference("lenet")
    ranks = run_workers(train, "lenet-nhwc", n_devices, True)
    assert_same(ranks[0], want, rtol=1e-5, atol=1e-6)
    assert_same(ranks[1], ranks[0], rtol=0, atol=0)


def train_gan(rank, world, n_devices, way):
    """Each process its consecutive part of every global batch; the README's two Trainers."""
    from tests.parallel.test_several_trainers import two_trainers
    from tests.tasks import gan
    parts = []
    for real, z in gan.batches():
        start, size = even_part(len(real), world, rank)
        parts.append((real[start:start + size], z[start:start + size]))
    model = two_trainers([dptrain.cpu(i) for i in range(n_devices)], way=way, data=parts)
    return {n: p.detach().tolist() for n, p in model.named_parameters()}


@pytest.mark.parametrize("n_devices, way", [(1, "freeze"), (2, "discard")])
def test_a_gan_on_two_processes_trains_as_the_plain_loop(n_devices, way):
    """The discriminator's gradients of the generator's step are sent (discard) or never
    computed (freeze): either way both processes end with the plain loop's weights."""
    from tests.tasks import gan
    want = {n: p.detach().tolist() for n, p in gan.plain_loop().named_parameters()}
    ranks = run_workers(train_gan, n_devices, way)
    assert_same(ranks[0], want, rtol=1e-5, atol=1e-6)
    assert_same(ranks[1], ranks[0], rtol=0, atol=0)
