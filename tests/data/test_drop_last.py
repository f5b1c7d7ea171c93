"""``drop_last``: each epoch's short last batch left out of training, for every kind of data,
the same global batches on any number of processes; a ``DataLoader``'s own ``drop_last`` taken."""
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler, TensorDataset
from torch.utils.data import WeightedRandomSampler

from dptrain.data import make_loader


class Samples(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(float(i))


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return (torch.tensor(float(i)) for i in range(self.n))


def _values(batch):
    return (batch[0] if isinstance(batch, (tuple, list)) else batch).tolist()


def _epoch(data, drop_last, rank=0, world=1, **kw):
    loader = make_loader(data, 8, drop_last=drop_last, shuffle=True, seed=1, rank=rank, world_size=world, **kw)
    loader.set_epoch(2)
    return len(loader), [_values(b) for b in loader]


KINDS = {
    "tensors": lambda n: (torch.arange(n).float(), torch.zeros(n)),
    "dataset": Samples,
    "dataloader": lambda n: DataLoader(TensorDataset(torch.arange(n).float()), batch_size=8),
    "sampler": lambda n: DataLoader(Samples(n), sampler=WeightedRandomSampler([1.0] * n, n)),
    "stream": Stream,
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_short_last_batch_is_dropped_and_the_processes_share_the_same_batches(kind):
    length, kept = _epoch(KINDS[kind](21), drop_last=True)
    full_length, full = _epoch(KINDS[kind](21), drop_last=False)
    assert (length, full_length) == (2, 3)
    assert [len(b) for b in kept] == [8, 8] and kept == full[:2]        # the same order, its last batch left out
    parts = [_epoch(KINDS[kind](21), drop_last=True, rank=r, world=2)[1] for r in (0, 1)]
    assert [a + b for a, b in zip(*parts)] == kept                     # each process its part of the same two


def test_a_dataloaders_drop_last_is_taken_unless_said_otherwise():
    loader = DataLoader(TensorDataset(torch.arange(21).float()), batch_size=8, drop_last=True)
    assert len(make_loader(loader, 8, drop_last=None)) == 2
    assert len(make_loader(loader, 8, drop_last=False)) == 3             # an evaluation reads every sample
    assert len(make_loader(loader, 8)) == 3
    keep = DataLoader(TensorDataset(torch.arange(21).float()), batch_size=8)
    assert len(make_loader(keep, 8, drop_last=None)) == 3
    assert len(make_loader(keep, 8, drop_last=True)) == 2


def test_what_drop_last_cannot_do_is_said():
    with pytest.raises(ValueError, match="every batch would be dropped; use a batch size of 5 or less"):
        make_loader((torch.zeros(5), torch.zeros(5)), 8, drop_last=True)
    class ByLength(BatchSampler):       # a batch sampler of one's own makes the batches
        pass
    batches = DataLoader(Samples(21), batch_sampler=ByLength(SequentialSampler(range(21)), 8, False))
    with pytest.raises(ValueError, match="ByLength makes the batches: drop short ones in it"):
        make_loader(batches, 8, drop_last=True)
