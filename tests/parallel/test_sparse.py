"""Sparse gradients (an ``nn.Embedding(sparse=True)``): trained by ``fit`` with the optimizer
users give them (``SparseAdam``, which takes nothing else) on any number of devices, as the
plain loop trains them on the whole batch on one device."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.parallel.sync.sparse import sparse_parameters


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(40, 8, sparse=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.emb(x))


def optimizers(model):
    return [torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-2),
            torch.optim.Adam(list(model.head.parameters()), lr=1e-2)]


def sparse_fit_difference(devices, accumulate=1, kvstore="device"):
    """The largest difference between ``fit``'s weights and the plain loop's (2 epochs, 4
    batches of 16, SparseAdam + Adam: it refuses a gradient made dense)."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randint(0, 40, (64, 5), generator=g), torch.randint(0, 3, (64,), generator=g)
    torch.manual_seed(0)
    model = Bag()
    dptrain.fit(model, (X, y), epochs=2, batch_size=16 // accumulate, devices=devices, shuffle=False,
                optimizer=optimizers(model), accumulate_grad_batches=accumulate, kvstore=kvstore, log=None)
    torch.manual_seed(0)
    plain = Bag()
    opts = optimizers(plain)
    for _ in range(2):
        for i in range(0, 64, 16):
            for o in opts:
                o.zero_grad()
            F.cross_entropy(plain(X[i:i + 16]), y[i:i + 16]).backward()
            for o in opts:
                o.step()
    return max((a - b).abs().max().item() for a, b in zip(model.parameters(), plain.parameters()))


@pytest.mark.parametrize("devices, accumulate", [("cpu:0", 1), ("cpu:0,cpu:1", 1), ("cpu:0,cpu:1,cpu:2", 2)])
def test_sparse_adam_on_devices_trains_as_the_plain_loop(devices, accumulate):
    assert sparse_fit_difference(devices, accumulate) < 1e-6


@pytest.mark.parametrize("kvstore", ["local", "naive"])
def test_sparse_adam_with_the_other_kvstores_trains_as_the_plain_loop(kvstore):
    assert sparse_fit_difference("cpu:0,cpu:1", kvstore=kvstore) < 1e-6


def test_the_ring_kvstore_refuses_a_sparse_gradient_naming_the_others():
    with pytest.raises(ValueError, match="kvstore='ring' cuts each gradient into chunks.*use kvstore='device'"):
        sparse_fit_difference("cpu:0,cpu:1", kvstore="ring")


def test_the_sparse_parameters_are_those_of_sparse_embeddings():
    model = nn.Sequential(nn.Embedding(5, 2, sparse=True), nn.Embedding(5, 2), nn.EmbeddingBag(5, 2, sparse=True),
                          nn.Linear(2, 2))
    assert sparse_parameters(model, list(model.parameters())) == [0, 2]
    assert sparse_parameters(model, list(model.parameters())[1:]) == [1]
