"""Batches of any structure split along the first axis, every sample exactly once, in order."""
import dataclasses
from collections import UserDict, namedtuple
from types import MappingProxyType

import pytest
import torch

from dptrain.data.batch import (Samples, batch_size, collate_samples, join_structure, needs_move, split_structure,
                                to_device)
from dptrain.core.devices import cpu

Pair = namedtuple("Pair", "x y")


class Encoding(UserDict):      # as Hugging Face's BatchEncoding: batch.input_ids reads batch["input_ids"]
    def __getattr__(self, key):
        try:
            return self.data[key]
        except KeyError:
            raise AttributeError(key) from None


@dataclasses.dataclass(frozen=True)
class Frozen:          # a collate_fn's batch as a dataclass (frozen, with a field __init__ does not set)
    x: torch.Tensor
    names: list
    tag: str = dataclasses.field(default="kept", init=False)


@pytest.mark.parametrize("make", [
    lambda n: torch.arange(n),
    lambda n: (torch.arange(n), torch.arange(n) * 10),
    lambda n: [torch.arange(n).view(n, 1), torch.arange(n)],
    lambda n: {"image": torch.arange(n).view(n, 1, 1), "label": torch.arange(n), "meta": {"id": torch.arange(n)}},
    lambda n: Pair(torch.arange(n), torch.arange(n)),
    lambda n: (torch.arange(n), [f"s{i}" for i in range(n)]),
    lambda n: Frozen(torch.arange(n), [f"s{i}" for i in range(n)]),
    lambda n: Encoding(image=torch.arange(n), label=torch.arange(n)),
], ids=["tensor", "tuple", "list", "dict", "namedtuple", "strings", "dataclass", "userdict"])
@pytest.mark.parametrize("n, sizes", [(7, [3, 2, 2]), (4, [4]), (5, [1, 1, 1, 1, 1])])
def test_every_sample_lands_once_in_order(make, n, sizes):
    batch = make(n)
    parts = split_structure(batch, sizes)
    assert [batch_size(p) for p in parts] == sizes
    assert type(parts[0]) is type(batch)
    first = lambda b: (b if isinstance(b, torch.Tensor) else b["image"] if isinstance(b, (dict, Encoding))  # noqa: E731
                       else b.x if isinstance(b, Frozen) else b[0])
    assert torch.cat([first(p).flatten() for p in parts]).tolist() == list(range(n))
    joined = join_structure(parts)          # the inverse: the batch again, its types kept
    assert type(joined) is type(batch) and torch.equal(first(joined), first(batch))
    assert [batch_size(p) for p in split_structure(joined, sizes)] == sizes
    if isinstance(batch, tuple) and isinstance(batch[1], list):
        assert sum((p[1] for p in parts), []) == batch[1]
    if isinstance(batch, Frozen):
        assert sum((p.names for p in parts), []) == batch.names and {p.tag for p in parts} == {"kept"}
        moved = to_device(batch, cpu(1), torch.channels_last)     # (rebuilt: a memory format to apply)
        assert isinstance(moved, Frozen) and torch.equal(moved.x, batch.x) and moved.names == batch.names
    if isinstance(batch, Encoding):
        assert parts[0].label.tolist() == list(range(sizes[0]))        # read as the user's forward reads it
        assert isinstance(to_device(batch, cpu(1), torch.channels_last), Encoding)


def test_a_mapping_that_cannot_be_built_from_a_dict_becomes_one():
    batch = MappingProxyType({"x": torch.arange(4), "y": torch.arange(4)})      # (takes a dict, refuses items)
    parts = split_structure(batch, [2, 2])
    assert [type(p) for p in parts] == [MappingProxyType] * 2 and parts[1]["y"].tolist() == [2, 3]

    class Fixed(UserDict):
        def __init__(self):
            super().__init__(x=torch.arange(4))
    parts = split_structure(Fixed(), [3, 1])
    assert [type(p) for p in parts] == [dict, dict] and parts[0]["x"].tolist() == [0, 1, 2]


def test_joining_keeps_none_and_names_what_it_cannot_join():
    joined = join_structure([{"loss": None, "logits": torch.zeros(2, 3)}, {"loss": None, "logits": torch.ones(1, 3)}])
    assert joined["loss"] is None and joined["logits"].shape == (3, 3)
    boxes = [[{"boxes": torch.zeros(k, 4)} for k in (3, 0)], [{"boxes": torch.zeros(1, 4)}]]  # per image
    assert [len(d["boxes"]) for d in join_structure(boxes)] == [3, 0, 1]
    assert [len(d["boxes"]) for d in join_structure([boxes[0], boxes[0]])] == [3, 0, 3, 0]
    with pytest.raises(TypeError, match="cannot join values of type float sample by sample"):
        join_structure([0.5, 0.25])


def test_items_kept_one_per_sample_are_dealt_out_whole():
    """A detection batch: images of their own sizes and a dict of boxes per image, collated by
    ``collate_samples`` (torchvision's ``tuple(zip(*batch))``, marked): 5 samples, though every
    image's first axis is 3 (its channels) and the boxes' differ."""
    samples = [(torch.full((3, 4 + k, 4 + k), float(k)), {"boxes": torch.zeros(k % 3 + 1, 4), "id": k})
               for k in range(5)]
    images, targets = batch = collate_samples(samples)
    assert type(images) is Samples and len(targets) == 5 and batch_size(batch) == 5
    parts = split_structure(batch, [2, 2, 1])
    assert [batch_size(p) for p in parts] == [2, 2, 1]
    assert [[int(im[0, 0, 0]) for im in p[0]] for p in parts] == [[0, 1], [2, 3], [4]]
    assert [[t["id"] for t in p[1]] for p in parts] == [[0, 1], [2, 3], [4]]
    joined = join_structure(parts)
    assert type(joined[0]) is Samples and [t["id"] for t in joined[1]] == list(range(5))
    moved = to_device(batch, cpu(1), torch.channels_last)
    assert type(moved[0]) is Samples and moved[0][4].shape == (3, 8, 8)
    assert batch_size((Samples(images[:2]), torch.zeros(2, 1))) == 2
    with pytest.raises(ValueError, match=r"different numbers of samples \[3, 5\]: .*collate_samples"):
        batch_size((images, torch.zeros(3)))
    with pytest.raises(ValueError, match=r"collate_fn=dptrain.data.collate_samples"):
        batch_size(tuple(zip(*samples)))          # unmarked: each image's channels are taken for samples
    single = collate_samples([torch.zeros(2), torch.ones(3)])     # samples that are not pairs: one Samples
    assert type(single) is Samples and [len(t) for t in single] == [2, 3] and batch_size(single) == 2


def test_sizes_must_agree():
    with pytest.raises(ValueError, match=r"numbers of samples \[3, 4\]: .*pad_sequence needs batch_first=True"):
        batch_size((torch.zeros(3), torch.zeros(4)))
    with pytest.raises(ValueError, match="no batch axis"):
        batch_size((torch.zeros(3), torch.tensor(1.0)))
    with pytest.raises(TypeError, match="at least one tensor"):
        batch_size(["a", "b"])


def test_virtual_cpu_devices_share_memory():
    x = torch.zeros(4, 1, 2, 2)
    assert to_device((x,), cpu(1))[0].data_ptr() == x.data_ptr()
    nhwc = to_device(x, cpu(0), torch.channels_last)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)


def test_batches_are_moved_only_where_moving_does_something():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    on_host = {"ids": torch.zeros(2, 3, dtype=torch.long), "labels": torch.zeros(2, dtype=torch.long)}
    assert not needs_move(on_host, cpu, None)
    assert not needs_move((torch.zeros(2, 3), torch.zeros(2)), cpu, None)
    assert needs_move(on_host, cpu, torch.channels_last)           # a memory format to take
    assert needs_move(on_host, meta, None)                         # another device
    assert needs_move({"x": torch.zeros(2, device="meta"), "y": torch.zeros(2)}, cpu, None)


def test_a_batch_already_on_the_host_is_given_back_as_it_is():
    ids, labels = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    cpu = torch.device("cpu")
    for batch in ({"ids": ids, "labels": labels}, (ids, ids, labels), [ids, labels]):
        assert to_device(batch, cpu) is batch
    nested = {"ids": ids, "extra": {"mask": ids}, "labels": labels}
    moved = to_device(nested, cpu)                      # nested: rebuilt, the same tensors
    assert moved is not nested and moved["extra"]["mask"] is ids
    on_meta = to_device({"ids": ids, "labels": labels}, torch.device("meta"))
    assert all(t.device.type == "meta" for t in on_meta.values())
    taken = to_device({"x": torch.zeros(2, 1, 2, 2)}, cpu, torch.channels_last)
    assert taken["x"].is_contiguous(memory_format=torch.channels_last)
