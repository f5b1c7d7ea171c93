"""A map-style Dataset read by worker processes: EpochPlan's order, every sample once, and
random transforms that draw the same numbers whatever the workers, processes or resume."""
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dptrain.data import DatasetLoader, TensorLoader, make_loader


class Indexed(Dataset):
    """Sample i is ``{"x": [i, torch noise, numpy + random noise], "y": i}``: random 'augmentations'."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        other = np.random.rand() + __import__("random").random()
        return {"x": torch.tensor([float(i), torch.rand(()).item(), other]), "y": i}


def epoch(loader, e, skip=0):
    loader.set_epoch(e)
    return list(loader.batches(skip))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_over_all_ranks(workers):
    n, world = 23, 3
    seen = []
    for rank in range(world):
        loader = DatasetLoader(Indexed(n), 5, num_workers=workers, shuffle=True, seed=3, rank=rank,
                               world_size=world)
        for batch in epoch(loader, 1):
            seen += batch["y"].tolist()
    assert sorted(seen) == list(range(n))


def test_the_order_is_the_in_memory_loaders_and_does_not_depend_on_the_world_size():
    n = 23
    ours = [b["y"].tolist() for b in epoch(DatasetLoader(Indexed(n), 5, shuffle=True, seed=3), 2)]
    memory = [b.tolist() for b in epoch(TensorLoader(torch.arange(n), 5, shuffle=True, seed=3), 2)]
    assert ours == memory
    halves = [epoch(DatasetLoader(Indexed(n), 5, shuffle=True, seed=3, rank=r, world_size=2), 2) for r in (0, 1)]
    assert [a["y"].tolist() + b["y"].tolist() for a, b in zip(*halves)] == ours


def test_random_transforms_draw_the_same_numbers_whatever_reads_them():
    n = 17
    one = epoch(DatasetLoader(Indexed(n), 4, shuffle=True, seed=1), 0)
    workers = epoch(DatasetLoader(Indexed(n), 4, num_workers=2, shuffle=True, seed=1), 0)
    parts = [epoch(DatasetLoader(Indexed(n), 4, shuffle=True, seed=1, rank=r, world_size=2), 0) for r in (0, 1)]
    resumed = epoch(DatasetLoader(Indexed(n), 4, shuffle=True, seed=1), 0, skip=2)
    for a, b in zip(one, workers):
        assert torch.equal(a["x"], b["x"])
    for a, p, q in zip(one, *parts):      # torch's, Python's and NumPy's numbers do not depend on the processes
        assert torch.equal(a["x"], torch.cat([p["x"], q["x"]]))
    for a, b in zip(one[2:], resumed):
        assert torch.equal(a["x"], b["x"])
    other_epoch = epoch(DatasetLoader(Indexed(n), 4, shuffle=False, seed=1), 1)
    assert not torch.equal(one[0]["x"][:, 1:], other_epoch[0]["x"][:, 1:])


@pytest.mark.parametrize("wrap", ["random_split", "validation_split", "stack"])
def test_a_subset_or_stack_of_a_dataset_draws_per_sample_whatever_the_processes(wrap):
    """torch's ``Subset`` and ``StackDataset`` have a ``__getitems__`` that reads sample by
    sample: seen through (read as one call, a part was seeded as a whole, and 2 processes
    drew other numbers than 1)."""
    from dptrain.data.holdout import hold_out
    n = 40
    if wrap == "random_split":
        data = torch.utils.data.random_split(Indexed(n), [30, 10], generator=torch.Generator().manual_seed(0))[0]
    elif wrap == "validation_split":
        data = hold_out(Indexed(n), 0.25)[0]
    else:
        data = torch.utils.data.StackDataset(Indexed(30), TensorDataset(torch.arange(30)))
    first = (lambda b: b[0]["x"]) if wrap == "stack" else (lambda b: b["x"])
    one = epoch(DatasetLoader(data, 6, shuffle=True, seed=1), 0)
    parts = [epoch(DatasetLoader(data, 6, shuffle=True, seed=1, rank=r, world_size=2), 0) for r in (0, 1)]
    for a, p, q in zip(one, *parts):
        assert torch.equal(first(a), torch.cat([first(p), first(q)]))


def test_reads_in_batches_sees_through_torchs_wrappers():
    from dptrain.data.seeded_reads import reads_in_batches

    class Batched(Indexed):
        def __getitems__(self, indices):
            return [self[i] for i in indices]
    plain, batched = Indexed(4), Batched(4)
    assert not reads_in_batches(torch.utils.data.Subset(torch.utils.data.Subset(plain, [0, 1]), [0]))
    assert reads_in_batches(torch.utils.data.Subset(batched, [0, 1])) and reads_in_batches(batched)
    assert not reads_in_batches(torch.utils.data.StackDataset(plain, plain))
    assert reads_in_batches(torch.utils.data.StackDataset(a=plain, b=batched))


def test_the_callers_random_state_is_left_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    epoch(DatasetLoader(Indexed(9), 4, shuffle=True), 0)
    assert torch.equal(torch.rand(3), expected)


def test_a_process_with_no_sample_gets_an_empty_batch_of_the_same_structure():
    loader = DatasetLoader(Indexed(5), 4, rank=2, world_size=3)      # last batch: 1 sample, 3 ranks
    batches = epoch(loader, 0)
    assert [len(b["y"]) for b in batches] == [1, 0]
    assert batches[1]["x"].shape == (0, 3)


def test_a_sampler_that_picks_samples_gives_each_epoch_its_indices_seeded_by_epoch():
    from torch.utils.data import (DataLoader, RandomSampler, SubsetRandomSampler, TensorDataset,
                                  WeightedRandomSampler)
    from torch.utils.data.distributed import DistributedSampler
    ds = TensorDataset(torch.arange(512).float(), torch.zeros(512))

    def epoch(loader, e, rank=0, world=1):
        made = make_loader(loader, 8, rank=rank, world_size=world, seed=3)
        made.set_epoch(e)
        return [int(v) for batch in made for v in batch[0].tolist()]
    weights = [1.0 if i % 4 == 0 else 0.0 for i in range(512)]       # only every 4th sample
    weighted = DataLoader(ds, sampler=WeightedRandomSampler(weights, 100))
    first = epoch(weighted, 0)
    assert len(first) == 100 and all(i % 4 == 0 for i in first) and len(set(first)) < 100   # with replacement
    assert epoch(weighted, 0) == first and epoch(weighted, 1) != first        # by (seed, epoch), not by the calls
    assert sorted(epoch(weighted, 0, 0, 2) + epoch(weighted, 0, 1, 2)) == sorted(first)    # the processes' parts
    with_generator = DataLoader(ds, sampler=WeightedRandomSampler(weights, 100, generator=torch.Generator()))
    assert epoch(with_generator, 0) == first                                  # its generator seeded alike
    subset = epoch(DataLoader(ds, sampler=SubsetRandomSampler(range(100))), 0)
    assert sorted(subset) == list(range(100)) and subset != list(range(100))
    assert len(epoch(DataLoader(ds, sampler=RandomSampler(ds, replacement=True, num_samples=40)), 0)) == 40
    with pytest.raises(TypeError, match="the sampler NoLength has no __len__"):
        make_loader(DataLoader(ds, sampler=NoLength()), 8)
    # Every sample, in any order (dptrain's order replaces it), or a DDP script's sampler: taken.
    for loader in (DataLoader(ds, shuffle=True), DataLoader(ds),
                   DataLoader(ds, sampler=DistributedSampler(ds, num_replicas=2, rank=0))):
        made = make_loader(loader, 8)
        assert made.global_num_samples == 512 and getattr(made, "sampler", None) is None


class NoLength(torch.utils.data.Sampler):
    def __iter__(self):
        return iter(range(10))


class Buckets(torch.utils.data.Sampler):
    """Batches of 7, 13 and 10 samples in turn, of a shuffle of ``n`` (by its generator)."""

    def __init__(self, n, sizes=(7, 13, 10), lie=0):
        self.n, self.sizes, self.lie, self.generator = n, sizes, lie, None

    def batches(self):
        order = torch.randperm(self.n, generator=self.generator).tolist()
        out, k = [], 0
        while order:
            out.append(order[:self.sizes[k % len(self.sizes)]])
            order, k = order[len(out[-1]):], k + 1
        return out

    def __iter__(self):
        return iter(self.batches())

    def __len__(self):
        return len(self.batches()) + self.lie


def test_a_batch_sampler_makes_the_global_batches_each_process_reading_its_part():
    from torch.utils.data import DataLoader, TensorDataset
    ds = TensorDataset(torch.arange(100).float(), torch.zeros(100))
    loader = DataLoader(ds, batch_sampler=Buckets(100))

    def epoch(e, rank=0, world=1, **plan):
        made = make_loader(loader, 8, rank=rank, world_size=world, seed=3, **plan)
        made.set_epoch(e)
        return made, [[int(v) for v in batch[0].tolist()] for batch in made]
    made, whole = epoch(0)
    assert [len(b) for b in whole] == [7, 13, 10] * 3 + [7, 3] and len(made) == 11
    assert [made.global_batch_size(b) for b in range(11)] == [len(b) for b in whole]
    assert sorted(v for b in whole for v in b) == list(range(100)) and made.global_num_samples == 100
    assert epoch(0)[1] == whole and epoch(1)[1] != whole                 # drawn by (seed, epoch)
    halves = [epoch(0, r, 2)[1] for r in range(2)]
    assert [a + b for a, b in zip(*halves)] == whole                     # each batch cut between the processes
    assert [len(a) for a in halves[0]] == [4, 7, 5] * 3 + [4, 2]
    cut, first = epoch(0, max_batches=2)
    assert len(cut) == 2 and first == whole[:2] and cut.global_num_samples == 20
    assert [[int(v) for v in b[0].tolist()] for b in made.batches(9)] == whole[9:]     # resumed part-way
    with pytest.raises(ValueError, match=r"the batch sampler Buckets gave 11 batches in epoch 1, but its __len__ "
                                         r"says 12"):
        make_loader(DataLoader(ds, batch_sampler=Buckets(100, lie=1)), 8)


class _Numbers(Dataset):
    def __init__(self, draw=None):
        self.draw = draw

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.draw is not None and i % 5 == 3:        # draws for some samples only
            self.draw()
        return torch.tensor([float(i)])


def _parts(n):
    from dptrain.data.seeded_reads import _Part
    for b in range(n):
        part = _Part(range(b * 4, b * 4 + 4))
        part.seed = (0, 1, b * 4)
        yield part


def test_a_dataset_that_draws_no_random_number_is_read_without_seeding_after_a_few_parts():
    from dptrain.data.seeded_reads import _Seeded
    seeded = _Seeded(_Numbers())
    first = [seeded.__getitems__(p) for p in _parts(_Seeded.WATCH)]
    assert not seeded._draws and seeded._watch == 0
    torch.manual_seed(3)
    later = [seeded.__getitems__(p) for p in _parts(_Seeded.WATCH)]       # unseeded now: the same samples
    assert [[t.item() for t in part] for part in later] == [[t.item() for t in part] for part in first]


@pytest.mark.parametrize("name, draw", [("torch", lambda: torch.rand(1)), ("random", lambda: random.random()),
                                        ("numpy", lambda: np.random.rand())])
def test_a_dataset_drawing_from_any_generator_stays_seeded_and_reproducible(name, draw):
    from dptrain.data.seeded_reads import _Seeded
    seen = []

    def recorded():
        seen.append(float(draw()))
    seeded = _Seeded(_Numbers(recorded))
    for p in _parts(_Seeded.WATCH + 2):
        seeded.__getitems__(p)
    assert seeded._draws == {name}          # only that generator is seeded (and saved) from then on
    again = _Seeded(_Numbers(recorded))
    first, seen[:] = list(seen), []
    for p in _parts(_Seeded.WATCH + 2):
        again.__getitems__(p)
    assert seen == first            # the same numbers: drawn under (seed, epoch, position) seeds


class _Noisy(Dataset):
    """Sample i is a generator's next number (an augmentation's draw)."""

    def __init__(self, draw=lambda: torch.rand(()).item()):
        self.draw = draw

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.draw()


@pytest.mark.parametrize("name, draw", [("torch", lambda: torch.rand(()).item()), ("random", lambda: random.random()),
                                        ("numpy", lambda: np.random.rand())])
def test_a_sample_draws_the_same_numbers_read_during_the_watch_and_after_it(name, draw):
    from dptrain.data.seeded_reads import _Seeded
    watched = _Seeded(_Noisy(draw))
    during = [x for p in _parts(_Seeded.WATCH) for x in watched.__getitems__(p)]
    assert watched._watch == 0 and watched._draws == {name}
    after = [x for p in _parts(_Seeded.WATCH) for x in watched.__getitems__(p)]     # the inline read
    assert after == during and len(set(during)) == len(during)


_DRAWS_IN_A_FRESH_INTERPRETER = """
import random, numpy as np, torch
from torch.utils.data import Dataset
from dptrain.data import DatasetLoader
class D(Dataset):
    def __len__(self): return 12
    def __getitem__(self, i): return torch.tensor([random.random(), np.random.rand(), torch.rand(()).item()])
loader = DatasetLoader(D(), 4, shuffle=True, seed=5)
print([b.tolist() for b in loader])
"""


def test_python_and_numpy_draws_are_the_same_in_every_run_whatever_the_hash_seed():
    # str hashes change with PYTHONHASHSEED, random in every run (and every process of a job)
    import subprocess
    import sys
    runs = [subprocess.run([sys.executable, "-c", _DRAWS_IN_A_FRESH_INTERPRETER], capture_output=True, text=True,
                           timeout=120, env={**__import__("os").environ, "PYTHONHASHSEED": seed})
            for seed in ("1", "2")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.count("[") > 3


@pytest.mark.parametrize("draw", [lambda: torch.rand(1), lambda: random.random(), lambda: np.random.rand()])
def test_the_callers_generators_are_left_alone_after_the_watch_too(draw):
    from dptrain.data.seeded_reads import _Seeded
    seeded = _Seeded(_Numbers(draw))
    for p in _parts(_Seeded.WATCH):
        seeded.__getitems__(p)
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    expected = torch.rand(2).tolist(), random.random(), np.random.rand()
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    for p in _parts(3):
        seeded.__getitems__(p)
    assert (torch.rand(2).tolist(), random.random(), np.random.rand()) == expected


class _StuckAt(Dataset):
    """Sample 5 never comes back (a worker stuck in __getitem__)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == 5:
            import time
            time.sleep(600)
        return torch.tensor([float(i)]), i % 2


def test_a_data_worker_stuck_in_getitem_is_named_with_its_samples_not_waited_on_forever():
    import time
    from dptrain.core.errors import DataStalled
    loader = DatasetLoader(_StuckAt(), 8, num_workers=2, worker_timeout=3, shuffle=False)
    start = time.monotonic()
    with pytest.raises(DataStalled, match=r"no batch from the data workers in 3 s: worker 0 is stuck reading batch 1 "
                                          r"of epoch 1 \(samples 0, 1, 2, 3, 4, 5, 6, 7\) in _StuckAt.__getitem__; "
                                          r".*--worker-timeout"):
        list(loader.batches())
    assert time.monotonic() - start < 60
    loader.close()


class _Niceness(Dataset):
    """Each sample: the priority (nice value) of the process reading it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import os
        return torch.tensor(os.nice(0))


@pytest.mark.parametrize("lower", [False, True])
def test_reading_workers_run_below_the_training_threads_only_when_asked(lower):
    import os
    loader = make_loader(_Niceness(), 2, num_workers=1, lower_priority=lower)
    try:
        seen = {int(v) for batch in loader.batches() for v in batch}
    finally:
        loader.close()
    here = os.nice(0)
    assert seen == ({min(here + 10, 19)} if lower else {here})


class _LateTorch(Dataset):
    """Draws from NumPy for every sample, from torch only past the watched parts."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        np.random.rand()
        return torch.rand(()).item() if i >= 4 * 8 else 0.0


def test_torch_stays_seeded_for_a_dataset_that_draws_even_if_torch_was_not_seen_drawing():
    from dptrain.data.seeded_reads import _Seeded
    assert _Seeded.WATCH == 8
    runs = []
    for caller_seed in (1, 2):          # the caller's own torch state must not show through
        torch.manual_seed(caller_seed)
        seeded = _Seeded(_LateTorch())
        runs.append([seeded.__getitems__(p) for p in _parts(16)])
        assert seeded._draws == {"numpy"}
    assert runs[0] == runs[1] and len(set(runs[0][-1])) == 4


class _Counted(Dataset):
    """Counts its reads; sample i is i, or torch's next number when ``noisy``."""

    def __init__(self, noisy):
        self.noisy, self.reads = noisy, 0

    def __len__(self):
        return 64

    def __getitem__(self, i):
        self.reads += 1
        return torch.rand(()).item() if self.noisy else float(i)


def test_the_watch_reads_a_quiet_dataset_once_and_a_drawing_ones_first_part_twice():
    """Watched parts are read under one seed; only a part where torch's generator moved is read
    again sample by sample (its numbers those of a sample-by-sample read: the test above)."""
    from dptrain.data.seeded_reads import _Seeded
    quiet, noisy = _Seeded(_Counted(False)), _Seeded(_Counted(True))
    for p in _parts(_Seeded.WATCH):
        quiet.__getitems__(p)
        noisy.__getitems__(p)
    assert quiet.dataset.reads == 4 * _Seeded.WATCH and not quiet._draws
    assert noisy.dataset.reads == 4 * _Seeded.WATCH + 4 and noisy._draws == {"torch"}


class _TorchThenPython(Dataset):
    """Draws from torch for every sample, and from Python's ``random`` too from sample 12 on
    (the 4th watched part of 4): counts its reads."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 64

    def __getitem__(self, i):
        self.reads += 1
        return (torch.rand(()).item(), random.random() if i >= 12 else None)


def test_a_generator_first_drawn_in_a_later_watched_part_is_caught_there_and_that_part_read_again():
    """After the first draw the watch seeds the drawn generators per sample and watches the
    others over the whole part (their states, taken per sample, cost ~50 us a sample); a part
    where one of them moved is read again: its samples are what a per-sample read gives."""
    from dptrain.data.seeded_reads import _Seeded
    watched = _Seeded(_TorchThenPython())
    during = [watched.__getitems__(p) for p in _parts(_Seeded.WATCH)]
    assert watched._draws == {"torch", "random"}
    assert watched.dataset.reads == 4 * _Seeded.WATCH + 4 + 4       # the 1st part and the 4th read twice
    known = _Seeded(_TorchThenPython())
    known._watch, known._draws = 0, {"torch", "random"}             # read as after the watch
    assert [known.__getitems__(p) for p in _parts(_Seeded.WATCH)] == during


class _TorchThenNumpy(_TorchThenPython):
    """As ``_TorchThenPython``, NumPy's generator in place of Python's."""

    def __getitem__(self, i):
        self.reads += 1
        return (torch.rand(()).item(), float(np.random.rand()) if i >= 12 else None)


def test_a_numpy_draw_in_a_later_watched_part_is_caught_by_its_mark_and_that_part_read_again():
    from dptrain.data.seeded_reads import _Seeded
    np.random.seed(11)
    caller = np.random.get_state()
    watched = _Seeded(_TorchThenNumpy())
    during = [watched.__getitems__(p) for p in _parts(_Seeded.WATCH)]
    assert watched._draws == {"torch", "numpy"}
    assert watched.dataset.reads == 4 * _Seeded.WATCH + 4 + 4
    after = np.random.get_state()
    assert after[2:] == caller[2:] and np.array_equal(after[1], caller[1])      # left as the caller had it
    known = _Seeded(_TorchThenNumpy())
    known._watch, known._draws = 0, {"torch", "numpy"}
    assert [known.__getitems__(p) for p in _parts(_Seeded.WATCH)] == during


def test_numpys_mark_moves_with_every_draw_and_follows_another_bit_generator():
    from dptrain.data.seeded_reads import _numpy_mark, _same_state
    np.random.seed(2)
    start = _numpy_mark()
    np.random.randint(10)
    assert not _same_state(start, _numpy_mark())
    np.random.seed(2)
    assert _same_state(start, _numpy_mark())            # read in place: a seed or set_state shows at once
    for _ in range(700):            # past the 624 words of a refill: the key moves, the position comes back
        np.random.randint(2**31)
    assert not _same_state(start, _numpy_mark())
    np.random.randn()               # one normal drawn, its pair's second kept: served next from the cache...
    cached = _numpy_mark()
    np.random.randn()
    assert _same_state(cached, _numpy_mark())           # ...without moving the words (the docstring's one miss)
    if hasattr(np.random, "set_bit_generator"):         # (NumPy >= 1.25)
        legacy = np.random.get_bit_generator()
        try:
            for other_kind in (np.random.PCG64, np.random.SFC64, np.random.Philox):     # (arrays in the last two)
                np.random.set_bit_generator(other_kind(0))
                other = _numpy_mark()
                assert _same_state(other, _numpy_mark())
                np.random.rand()
                assert not _same_state(other, _numpy_mark())
        finally:
            np.random.set_bit_generator(legacy)


def test_a_later_loader_of_the_same_dataset_watches_one_part_and_reads_what_a_fresh_one_reads():
    """What the watch found is kept for the Dataset object: each ``evaluate`` call's fresh
    loader of a quiet set watched 8 parts (~1.5 ms of a text classifier's 35 ms evaluation)."""
    from dptrain.data.seeded_reads import _Seeded
    quiet, noisy = _Counted(False), _Counted(True)
    for dataset in (quiet, noisy):
        first = _Seeded(dataset)
        read_first = [first.__getitems__(p) for p in _parts(_Seeded.WATCH)]
        dataset.reads = 0
        later = _Seeded(dataset)
        assert later._watch == 1 and later._draws == first._draws
        assert [later.__getitems__(p) for p in _parts(_Seeded.WATCH)] == read_first
        assert dataset.reads == 4 * _Seeded.WATCH           # its first part read once: the draws were known
    assert _Seeded(_Counted(False))._watch == _Seeded.WATCH         # another object of the class: watched


def test_a_draw_added_to_a_watched_dataset_is_caught_in_the_next_loaders_first_part():
    from dptrain.data.seeded_reads import _Seeded
    dataset = _Numbers()
    watched = _Seeded(dataset)
    for p in _parts(_Seeded.WATCH):
        watched.__getitems__(p)
    assert not watched._draws
    seen = []
    dataset.draw = lambda: seen.append(random.random())        # an augmentation switched on between two evaluations
    later = _Seeded(dataset)
    for p in _parts(_Seeded.WATCH):
        later.__getitems__(p)
    assert later._draws == {"random"}
    fresh, first = _Seeded(_Numbers(lambda: seen.append(random.random()))), list(seen)
    seen[:] = []
    for p in _parts(_Seeded.WATCH):
        fresh.__getitems__(p)
    assert seen == first            # seeded by position from the first part on, as a fresh watch seeds them


class _Slotted(Dataset):
    __slots__ = ("n",)          # no weak references: nothing kept

    def __init__(self):
        self.n = 16

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return float(i)


def test_what_a_watch_found_goes_with_its_dataset_and_needs_no_weak_reference():
    import gc
    from dptrain.data import seeded_reads
    dataset = _Counted(False)
    seeded = seeded_reads._Seeded(dataset)
    for p in _parts(seeded_reads._Seeded.WATCH):
        seeded.__getitems__(p)
    key = id(dataset)
    assert key in seeded_reads._SEEN
    del dataset, seeded
    gc.collect()
    assert key not in seeded_reads._SEEN
    slotted = seeded_reads._Seeded(_Slotted())
    assert [slotted.__getitems__(p) for p in _parts(4)] == [[float(i) for i in range(b * 4, b * 4 + 4)] for b in range(4)]
    assert seeded_reads._Seeded(slotted.dataset)._watch == seeded_reads._Seeded.WATCH


class _OpenedPerWorker(Dataset):
    """A file handle opened per worker by the DataLoader's worker_init_fn (h5py, LMDB)."""
    handle = None

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if self.handle is None:
            raise RuntimeError("the worker_init_fn did not run: no handle")
        return torch.tensor([float(i), float(self.handle)])


def _open_handle(worker_id):
    torch.utils.data.get_worker_info().dataset.handle = 100 + worker_id


@pytest.mark.parametrize("lower", [False, True])
def test_a_dataloaders_worker_init_fn_runs_in_every_worker(lower):
    loader = make_loader(DataLoader(_OpenedPerWorker(), num_workers=2, worker_init_fn=_open_handle), 4,
                         lower_priority=lower)
    try:
        rows = torch.cat(list(loader.batches()))
    finally:
        loader.close()
    assert sorted(rows[:, 0].tolist()) == list(map(float, range(16)))
    assert set(rows[:, 1].tolist()) == {100.0, 101.0}


def test_a_dataloaders_prefetch_factor_and_start_method_reach_the_reading_workers():
    import multiprocessing
    given = DataLoader(_OpenedPerWorker(), num_workers=2, worker_init_fn=_open_handle, prefetch_factor=3,
                       multiprocessing_context="fork")
    loader = make_loader(given, 4)
    try:
        assert len(torch.cat(list(loader.batches()))) == 16
        inner = loader._loader
        assert inner.prefetch_factor == 3
        assert inner.multiprocessing_context is multiprocessing.get_context("fork")
    finally:
        loader.close()
