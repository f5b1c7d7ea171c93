"""Dropout on several CPU devices of one process draws from each device's stream; activation
checkpointing replays a block's draws in the backward pass from that stream too, so its
gradients are the forward's (the replay drew other masks before: 0.02 off after 8 steps)."""
import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import dptrain


class Block(nn.Module):
    def __init__(self, functional):
        super().__init__()
        self.inner, self.outer, self.drop, self.functional = nn.Linear(16, 16), nn.Linear(16, 16), nn.Dropout(0.3), \
            functional

    def forward(self, h):
        z = torch.tanh(self.inner(h))
        z = nn.functional.dropout(z, 0.3, self.training) if self.functional else self.drop(z)
        return h + self.outer(z)


class Net(nn.Module):
    """Two residual blocks with dropout inside, each checkpointed in training (``checkpointed``:
    "reentrant", "not reentrant", or None for none)."""

    def __init__(self, checkpointed, functional=False):
        super().__init__()
        self.first, self.last, self.checkpointed = nn.Linear(6, 16), nn.Linear(16, 3), checkpointed
        self.blocks = nn.ModuleList(Block(functional) for _ in range(2))

    def forward(self, x):
        h = self.first(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=self.checkpointed == "reentrant") \
                if self.training and self.checkpointed else block(h)
        return self.last(h)


def trained(checkpointed, devices, functional=False):
    torch.manual_seed(0)
    model = Net(checkpointed, functional).double()
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (64,), generator=g)
    dptrain.fit(model, (X, y), epochs=2, batch_size=16, shuffle=False, log=None, devices=devices, seed=1,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    return model


@pytest.mark.parametrize("checkpointed", ["reentrant", "not reentrant"])
@pytest.mark.parametrize("devices", ["cpu:0,cpu:1", "cpu:0,cpu:1,cpu:2"])
def test_checkpointed_blocks_replay_the_dropout_masks_of_the_forward(checkpointed, devices):
    plain, replayed = trained(None, devices), trained(checkpointed, devices)
    for p, q in zip(plain.parameters(), replayed.parameters()):
        assert torch.equal(p, q)
    assert torch.get_rng_state is torch.random.get_rng_state and torch.set_rng_state is torch.random.set_rng_state


def test_draws_outside_dropout_layers_in_a_checkpointed_block_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"outside nn.Dropout layers .*activation checkpointing.*devices=1"):
        trained("not reentrant", "cpu:0,cpu:1", functional=True)
    trained("not reentrant", "cpu:0", functional=True)          # one device: torch's own replay
    assert torch.get_rng_state is torch.random.get_rng_state


def test_on_other_threads_the_generators_state_is_torchs():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    trained("not reentrant", "cpu:0,cpu:1")
    torch.set_rng_state(before)
    assert torch.equal(torch.get_rng_state(), before)
