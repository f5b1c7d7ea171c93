"""``BatchedStream``: each batch a stream yields is a global batch; each process keeps its
consecutive part of it (none where a batch has fewer samples than processes), knows every
batch's size as it reads it, and resumes at a batch by reading the ones before."""
import numpy as np
import torch
from torch.utils.data import IterableDataset

from dptrain.data.batched_stream import BatchedStream


class Batches(IterableDataset):
    """Batches of ``sizes`` rows ``[i, 10 * i]`` (NumPy arrays, as a store gives them)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        start = 0
        for n in self.sizes:
            yield np.array([[i, 10 * i] for i in range(start, start + n)])
            start += n


def rows(batches):
    return [[int(v) for v in b[:, 0]] for b in batches]


def test_each_process_keeps_its_part_of_each_batch_and_every_size_is_known():
    sizes = [5, 1, 4]
    parts = [BatchedStream(Batches(sizes), rank=r, world_size=2) for r in range(2)]
    got = [rows(p) for p in parts]
    assert got == [[[0, 1, 2], [5], [6, 7]], [[3, 4], [], [8, 9]]]
    assert all(isinstance(b, torch.Tensor) for b in parts[1])       # (converted, as a DataLoader does)
    for p in parts:
        assert p.batch_size == 5 and p.open_ended and p.read_batches == 3
        assert [p.global_batch_size(b) for b in range(3)] == sizes and p.global_samples(3) == 10
        assert p.count_of([torch.zeros(4, 2)]) == 4
    assert tuple(parts[0].example().shape) == (1, 2) and tuple(parts[0].empty_batch().shape) == (0, 2)


def test_a_resumed_epoch_reads_the_batches_before_its_own_and_counts_them():
    loader = BatchedStream(Batches([3, 2, 4, 1]))
    assert rows(loader.batches(2)) == [[5, 6, 7, 8], [9]]
    assert loader.global_samples(2) == 5 and loader.global_samples(4) == 10
