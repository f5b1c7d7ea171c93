import pytest
import torch

from dptrain.data import ArrayLoader


def loader(n=1000, **kw):
    X = torch.arange(n).float().reshape(n, 1)
    return ArrayLoader(X, torch.arange(n), **kw)


def test_an_epoch_uses_every_sample_once_and_keeps_pairs():
    ld = loader(1000, batch_size=64, shuffle=True, seed=3)
    seen = []
    for X, y in ld:
        assert torch.equal(X[:, 0].long(), y)
        seen.append(y)
    assert len(seen) == len(ld) == 16 and len(seen[-1]) == 1000 - 15 * 64
    assert sorted(torch.cat(seen).tolist()) == list(range(1000))


def test_order_depends_only_on_seed_and_epoch():
    a, b = loader(batch_size=100, shuffle=True, seed=1), loader(batch_size=100, shuffle=True, seed=1)
    first = torch.cat([y for _, y in a])
    assert torch.equal(first, torch.cat([y for _, y in b]))
    a.set_epoch(1)
    second = torch.cat([y for _, y in a])
    assert not torch.equal(first, second)
    b.set_epoch(1)
    assert torch.equal(second, torch.cat([y for _, y in b]))
    assert not torch.equal(first, torch.arange(1000))


def test_max_batches_and_drop_last():
    ld = loader(1000, batch_size=300, max_batches=2)
    assert len(ld) == 2 and ld.num_samples == 600
    assert [len(y) for _, y in ld] == [300, 300]
    ld = loader(1000, batch_size=300, drop_last=True)
    assert [len(y) for _, y in ld] == [300] * 3 and ld.num_samples == 900
    assert loader(1000, batch_size=300).num_samples == 1000


@pytest.mark.parametrize("kw, message", [
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(batch_size=4, max_batches=0), "max_batches must be a whole number >= 1"),
])
def test_bad_arguments(kw, message):
    with pytest.raises(ValueError, match=message):
        loader(**kw)


def test_prefetch_yields_the_same_batches_in_order():
    from dptrain.data.loader import prefetch
    ld = loader(1000, batch_size=64, shuffle=True, seed=2)
    assert [y.tolist() for _, y in prefetch(ld)] == [y.tolist() for _, y in ld]


def test_prefetch_passes_on_errors_and_stops_early():
    from dptrain.data.loader import prefetch

    def broken():
        yield 1
        raise OSError("disk gone")
    it = prefetch(broken())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    endless = prefetch(iter(range(10**9)))
    assert next(endless) == 0
    endless.close()          # the producer thread stops


@pytest.mark.parametrize("n, batch_size, world", [(1000, 64, 2), (1001, 64, 3), (10, 4, 3), (7, 3, 4)])
def test_sharding_covers_every_sample_exactly_once(n, batch_size, world):
    shards = [loader(n, batch_size=batch_size, shuffle=True, seed=5, rank=r, world_size=world) for r in range(world)]
    seen = []
    for b, batches in enumerate(zip(*shards)):   # every rank walks the same global batches
        sizes = [len(y) for _, y in batches]
        assert max(sizes) - min(sizes) <= 1
        assert all(s.global_batch_size(b) == sum(sizes) for s in shards)   # known without a message
        seen += [y for _, y in batches]
    assert sorted(torch.cat(seen).tolist()) == list(range(n))
    assert sum(s.num_samples for s in shards) == n
    assert all(len(s) == len(shards[0]) for s in shards)


def test_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank must be in"):
        loader(10, batch_size=2, rank=2, world_size=2)


def test_data_held_on_a_device_gives_the_same_batches_there():
    """What a GPU run does (data moved once, batches gathered on the device), on the meta device."""
    import torch
    from dptrain.data import TensorLoader
    X, y = torch.arange(20).view(10, 2).to(torch.uint8), torch.arange(10)
    host = TensorLoader((X, y), 4, shuffle=True, seed=2)
    device = TensorLoader((X, y), 4, shuffle=True, seed=2).to(torch.device("meta"))
    assert device.nbytes == 20 + 80
    for (a, b), (c, d) in zip(host, device):
        assert c.device.type == "meta" and c.dtype == torch.uint8 and c.shape == a.shape and d.shape == b.shape


def test_a_process_part_of_one_sample_goes_to_another_process_with_a_least_part():
    """A model with BatchNorm (``least_part=2``): a last batch of 3 over 2 processes is all
    rank 0's, not 2 + 1 (BatchNorm refuses to train on one sample); every sample still once."""
    seen = []
    for rank in range(2):
        ld = loader(67, batch_size=32, rank=rank, world_size=2)
        ld.least_part = 2
        sizes = [len(y) for _, y in ld]
        assert sizes == ([16, 16, 3] if rank == 0 else [16, 16, 0])
        seen += [v for _, y in ld for v in y.tolist()]
    assert sorted(seen) == list(range(67))


def test_a_sparse_matrix_is_an_error_whose_dataset_of_rows_trains_as_written():
    """A TF-IDF matrix (torch's sparse COO, SciPy's csr_matrix) failed deep in the checks
    ("unsupported memory format option Contiguous"): the error gives the fixes."""
    import dptrain
    from torch import nn
    torch.manual_seed(0)
    dense = (torch.rand(40, 6) < 0.3).float()
    X, y = dense.to_sparse(), (dense.sum(1) > 1).long()
    with pytest.raises(TypeError, match=r"the data holds a sparse matrix \(a sparse_coo tensor, 40 rows\), which batches "
                                        r"are not cut from: give X.to_dense\(\) if it fits in memory, or a Dataset"):
        dptrain.fit(nn.Linear(6, 2), (X, y), epochs=1, log=None)

    class Rows(torch.utils.data.Dataset):               # the error's fix, as written
        __len__ = lambda self: X.shape[0]               # noqa: E731
        __getitem__ = lambda self, i: (X[i].to_dense(), y[i])   # noqa: E731
    model = nn.Linear(6, 2)
    dptrain.fit(model, Rows(), epochs=1, batch_size=8, devices=2, log=None, shuffle=False)
    want = nn.Linear(6, 2)
    want.load_state_dict(model.state_dict())
    assert dptrain.evaluate(model, (dense, y))["test_loss"] == dptrain.evaluate(want, Rows())["test_loss"]

    class CSR:                  # (SciPy's, as the check sees it: toarray and nnz)
        shape, nnz = (40, 6), 12

        def toarray(self):
            return dense.numpy()
    with pytest.raises(TypeError, match=r"\(SciPy's CSR, 40 rows\).*give torch.from_numpy\(X.toarray\(\)\)"):
        dptrain.fit(nn.Linear(6, 2), (CSR(), y), epochs=1, log=None)
