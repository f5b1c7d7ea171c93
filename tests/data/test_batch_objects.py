"""A batch object of one's own (PyG's ``Batch``: ``.to(device)``, ``batch_size``): counted by
what it says, moved by its own ``to``, never cut into parts (an error naming the fixes); the
structures dptrain reads are not such objects."""
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

from dptrain.data.batch import batch_size, map_tensors, split_structure, to_device
from dptrain.data.batch_objects import declared_size, own_object


class Graphs:
    def __init__(self, x, y, moved=None):
        self.x, self.y, self.moved = x, y, moved

    def to(self, device):
        return Graphs(self.x.to(device), self.y.to(device), moved=device)


class Sized(Graphs):
    num_graphs = property(lambda self: len(self.y))


@dataclasses.dataclass
class Pair:
    x: torch.Tensor

    def to(self, device):
        return self


def test_objects_of_ones_own_are_told_from_the_structures_read():
    assert own_object(Graphs(torch.ones(5, 2), torch.ones(2)))
    assert not any(own_object(v) for v in (torch.ones(2), {"x": 1}, (1,), [1], "s", np.ones(2), nn.Linear(1, 1),
                                           Pair(torch.ones(2)), Graphs, 3))


def test_its_samples_are_what_it_says_else_the_error_says_what_to_give():
    assert declared_size(Sized(torch.ones(7, 2), torch.ones(3))) == 3
    assert batch_size((Sized(torch.ones(7, 2), torch.ones(3)), torch.ones(3))) == 3
    assert batch_size((Graphs(torch.ones(7, 2), torch.ones(3)), torch.ones(3))) == 3     # (counted by the tensor)
    with pytest.raises(TypeError, match=r"got Graphs, which does not say how many samples it holds: give Graphs a "
                                        r"batch_size attribute"):
        batch_size(Graphs(torch.ones(7, 2), torch.ones(3)))


def test_it_is_moved_by_its_own_to_and_never_cut():
    batch = {"g": Sized(torch.ones(7, 2), torch.ones(3)), "w": torch.ones(3)}
    moved = to_device(batch, torch.device("meta"))
    assert moved["g"].moved == torch.device("meta") and moved["w"].device.type == "meta"
    assert map_tensors(lambda t: t, batch)["g"] is batch["g"]         # (without objects=: as it is)
    with pytest.raises(TypeError, match=r"a batch holding a Sized \(one object, whose tensors share no first axis\) "
                                        r"cannot be cut into parts of the batch, one per device: train on one device "
                                        r"a process \(devices=1"):
        split_structure(batch, [2, 1])


def test_a_packed_sequence_is_one_object_of_its_sequences():
    packed = pack_sequence([torch.ones(4, 2), torch.ones(3, 2), torch.ones(1, 2)])
    assert own_object(packed) and batch_size((packed, torch.zeros(3))) == 3
    moved = to_device((packed, torch.zeros(3)), torch.device("meta"))
    assert type(moved[0]) is type(packed) and moved[0].data.device.type == "meta"
    with pytest.raises(TypeError, match=r"a batch holding a PackedSequence"):
        split_structure((packed, torch.zeros(3)), [2, 1])


@pytest.mark.parametrize("workers", [0, 1])
def test_samples_that_are_objects_of_ones_own_get_an_error_naming_collate_fn(workers):
    import dptrain
    samples = [Graphs(torch.randn(3, 2), torch.tensor(i % 2)) for i in range(8)]
    with pytest.raises(TypeError, match=r"samples of type Graphs \(an object of your own, with its own to\) cannot be "
                                        r"stacked into a batch by torch's default_collate: pass collate_fn="):
        dptrain.fit(nn.Linear(2, 2), samples, None, epochs=1, batch_size=4, devices=1, num_workers=workers, log=None)
    # what it says works: a collate_fn making their batch object
    collate = lambda items: Sized(torch.stack([g.x.mean(0) for g in items]), torch.stack([g.y for g in items]))  # noqa
    dptrain.fit(nn.Linear(2, 2), samples, None, epochs=1, batch_size=4, devices=1, collate_fn=collate, log=None,
                forward=lambda model, batch: (model(batch.x), batch.y))
    # samples default_collate cannot take that are not such objects: torch's own error, as it was
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        dptrain.fit(nn.Linear(2, 2), [object() for _ in range(8)], None, epochs=1, batch_size=4, devices=1, log=None)
