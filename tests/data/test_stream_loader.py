"""``StreamLoader``: an ``IterableDataset`` cut into global batches, each process's part of
each, an epoch a pass or ``steps_per_epoch`` batches of a stream running on. (How a pass is
read, its random numbers and workers: ``test_stream_reader.py``.)"""
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dptrain.data import make_loader
from dptrain.data.batched_stream import BatchedStream
from dptrain.data.stream_loader import StreamLoader


class Numbers(IterableDataset):
    """Samples ``(start + i, noise)``; a pass of ``n``; ``set_epoch(e)`` starts it at e * 1000;
    ``noise`` draws from torch, Python and NumPy (or is 0)."""

    def __init__(self, n, draws=False, length=None):
        self.n, self.draws, self.length, self.epoch, self.epochs_set = n, draws, length, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __iter__(self):
        worker = get_worker_info()
        ids = range(self.n) if worker is None else range(worker.id, self.n, worker.num_workers)
        for i in ids:
            noise = torch.rand(()).item() + random.random() + np.random.rand() if self.draws else 0.0
            yield torch.tensor([self.epoch * 1000 + i, noise], dtype=torch.float64)


class Sized(Numbers):
    def __len__(self):
        return self.n if self.length is None else self.length


def ids(batches):
    return [int(v) for b in batches for v in b[:, 0].tolist()]


def test_an_epoch_is_a_pass_cut_into_global_batches_each_process_taking_its_part():
    stream = Sized(23)
    parts = [list(StreamLoader(stream, 5, rank=r, world_size=2).batches()) for r in range(2)]
    assert [len(p) for p in parts] == [5, 5]
    # batch b is rank 0's part then rank 1's: the stream's order, every sample once
    assert [v for b in range(5) for r in range(2) for v in ids([parts[r][b]])] == list(range(23))
    assert [len(parts[r][4]) for r in range(2)] == [2, 1]       # the last batch of 3: parts as even_part cuts them
    loader = StreamLoader(stream, 5)
    assert len(loader) == 5 and loader.global_batch_size(4) == 3
    loader.set_epoch(2)
    assert ids(loader) == [2000 + i for i in range(23)] and stream.epochs_set[-1] == 2
    assert ids(loader.batches(3)) == [2000 + i for i in range(15, 23)]       # resumed part-way


def test_a_last_part_with_no_sample_keeps_the_batch_structure():
    parts = list(StreamLoader(Sized(5), 4, rank=2, world_size=3).batches())
    assert [tuple(p.shape) for p in parts] == [(1, 2), (0, 2)]


def test_steps_per_epoch_runs_one_stream_on_across_epochs_and_passes():
    stream = Numbers(7)
    loader = StreamLoader(stream, 3, steps_per_epoch=2)
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        seen.append(ids(loader))
    # 7 samples a pass: a batch may hold the end of one pass and the start of the next
    assert seen == [[0, 1, 2, 3, 4, 5], [6, 1000, 1001, 1002, 1003, 1004], [1005, 1006, 2000, 2001, 2002, 2003]]
    fresh = StreamLoader(Numbers(7), 3, steps_per_epoch=2)      # a resumed run: read up to its place
    fresh.set_epoch(2)
    assert ids(fresh.batches(1)) == seen[2][3:]
    loader.set_epoch(1)                                        # and back again
    assert ids(loader.batches(1)) == seen[1][3:]


def test_a_pass_shorter_or_longer_than_its_len_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match=r"yielded 10 samples in pass 1, but its __len__ says 12"):
        list(StreamLoader(Sized(10, length=12), 4))
    with pytest.raises(ValueError, match=r"more samples in pass 1 than its __len__ \(8\)"):
        list(StreamLoader(Sized(10, length=8), 4))
    assert len(list(StreamLoader(Sized(10, length=8), 4, max_batches=1))) == 1    # a cut epoch reads no further


def test_without_a_length_a_pass_is_read_to_its_end_its_batch_sizes_known_as_read():
    loader = StreamLoader(Numbers(10), 4)
    assert loader.open_ended and loader.global_num_samples is None
    batches = loader.batches()
    next(batches)
    assert loader.read_batches == 1 and loader.global_samples(5) == 4      # (only what was read)
    assert ids(batches) == list(range(4, 10))
    assert [loader.global_batch_size(b) for b in range(3)] == [4, 4, 2]
    assert [loader.global_samples(b) for b in range(4)] == [0, 4, 8, 10]
    assert ids(loader.batches(1)) == list(range(4, 10))         # (resumed after batch 1)
    with pytest.raises(ValueError, match=r"Numbers yielded 4 samples in pass 1, fewer than the 3 batches of 4"):
        list(StreamLoader(Numbers(4), 4).batches(3))
    with pytest.raises(TypeError, match="has no __len__: an epoch of it is a pass read to its end"):
        len(loader)
    assert not StreamLoader(Sized(10), 4).open_ended and StreamLoader(Sized(10), 4).global_num_samples == 10
    with pytest.raises(ValueError, match="yielded no sample in pass 1"):
        list(StreamLoader(Numbers(0), 4, steps_per_epoch=2))


def test_make_loader_takes_a_stream_or_a_dataloader_over_one():
    stream = Sized(9)
    loader = make_loader(DataLoader(stream, batch_size=4, collate_fn=lambda s: torch.stack(s) * 2), 3)
    assert isinstance(loader, StreamLoader) and ids(loader) == [2 * i for i in range(9)]
    assert ids(make_loader(stream, 3, shuffle=True)) == list(range(9))      # read in its own order
    assert loader.example().shape == (1, 2)
    batched = make_loader(DataLoader(stream, batch_size=None), 3)        # it yields batches: batched_stream.py
    assert isinstance(batched, BatchedStream) and len(batched) == 9 and batched.batch_size == 2
    with pytest.raises(ValueError, match="steps_per_epoch counts the epochs of a stream"):
        make_loader(torch.zeros(10, 2), 3, steps_per_epoch=2)


class _Range(IterableDataset):
    """torch's documented pattern: ``worker_init_fn`` cuts each worker's copy of the range."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __len__(self):
        return self.end - self.start

    def __iter__(self):
        return (torch.tensor(float(i)) for i in range(self.start, self.end))


def _cut_range(worker_id):
    info = get_worker_info()
    whole = info.dataset
    per = -(-(whole.end - whole.start) // info.num_workers)
    whole.start, whole.end = whole.start + worker_id * per, min(whole.start + (worker_id + 1) * per, whole.end)


def test_a_dataloaders_worker_init_fn_shards_the_stream_for_its_workers():
    loader = make_loader(DataLoader(_Range(0, 24), batch_size=4, num_workers=2, worker_init_fn=_cut_range,
                                    prefetch_factor=3), 4)
    assert loader.worker_options == {"prefetch_factor": 3}     # (its other settings reach the workers too)
    try:
        seen = [v for batch in loader for v in batch.tolist()]
    finally:
        loader.close()
    assert sorted(seen) == list(map(float, range(24)))          # each sample once, not once per worker
