"""dptrain's bucketed, hook-launched allreduce gives DistributedDataParallel's gradients."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from dptrain.distributed.collective import Collective, get_collective
from dptrain.parallel.sync.buckets import BucketReducer, plan_buckets
from dptrain.models import GluonLeNet
from tests.distributed.helpers import run_workers


def grads(rank, world, bucket_mb):
    torch.manual_seed(0)
    ours, theirs = GluonLeNet(), GluonLeNet()
    theirs.load_state_dict(ours.state_dict())
    ddp = DistributedDataParallel(theirs, bucket_cap_mb=bucket_mb)
    reducer = BucketReducer([list(ours.parameters())], get_collective(), bucket_cap_mb=bucket_mb)
    g = torch.Generator().manual_seed(100 + rank)          # each rank its own, equal-sized shard
    X, y = torch.rand(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
    F.cross_entropy(ddp(X), y).backward()                  # DDP: mean per rank, averaged over ranks
    extras = [float(rank), 1.0, 2.0 * rank]                # they ride along: a tensor, or numbers
    reducer.prepare(len(X), extras=torch.tensor(extras) if bucket_mb > 1 else tuple(extras))
    F.cross_entropy(ours(X), y, reduction="sum").backward()   # ours: sums, / global count
    used, total = reducer.finish()
    assert reducer.summed_extras.tolist() == [1.0, 2.0, 2.0]
    reducer.scatter(0, used, 1.0 / total)
    assert int(total) == 8 * world and used == list(range(len(list(ours.parameters()))))
    return [(a.grad - b.grad).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters())], \
        len(reducer.buckets)


@pytest.mark.parametrize("bucket_mb", [25.0, 0.01])
def test_same_gradients_as_ddp(bucket_mb):
    for diffs, n_buckets in run_workers(grads, bucket_mb):
        assert max(diffs) < 1e-6
        assert (n_buckets > 1) == (bucket_mb < 1)


def test_buckets_go_last_parameter_first_and_respect_the_cap():
    sizes = [(100, torch.float32), (10, torch.float32), (300, torch.float32), (5, torch.float64)]
    assert plan_buckets(sizes, cap_bytes=1600) == [[3], [2, 1], [0]]     # 1200 + 40 B fit, + 400 B not
    assert plan_buckets(sizes, cap_bytes=10**6) == [[3], [2, 1, 0]]    # one dtype per bucket


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def reducer_operations(layers, extras=None):
    """ATen operations a step of the reducer adds to a plain backward, for ``layers`` Linears."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
    reducer = BucketReducer([list(model.parameters())], Collective())
    X = torch.randn(8, 4)

    def step(enabled):
        reducer.enabled = enabled
        reducer.prepare(len(X), extras=extras if enabled else None)
        with _Ops() as ops:
            model(X).sum().backward()
            if enabled:
                used, total = reducer.finish()
                reducer.scatter(0, used, 1.0 / total)
        return ops.count
    step(True)
    return step(True) - step(False)


def test_the_reducers_operations_a_step_do_not_grow_with_the_parameters():
    """Each is a kernel launch on a GPU: per bucket, not per parameter (was 3-4 a parameter)."""
    few, many = reducer_operations(1), reducer_operations(30)
    assert few == many and few < 20, (few, many)


def test_extras_given_as_numbers_are_written_with_the_counts():
    """The stop flags ride every step: as Python numbers they cost only the copy of their sums
    (a slice and a clone), as a tensor 3 operations more (was 5 more than none, in any form)."""
    none = reducer_operations(1)
    numbers, tensor = reducer_operations(1, (0.0, 1.0, 0.0, 0.0)), reducer_operations(1, torch.tensor([0.0, 1, 0, 0]))
    assert numbers == none + 2 and tensor > numbers, (none, numbers, tensor)


def test_the_counts_are_read_back_only_when_this_process_lacked_a_gradient():
    """On a GPU each read of the summed counts is a host wait for the all_reduce: a reducer
    on the meta device (whose tensors cannot be read) shows when one happens."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to("meta")
    reducer = BucketReducer([list(model.parameters())], Collective(), comm_device=torch.device("meta"))
    X = torch.randn(8, 4, device="meta")
    reducer.prepare(len(X))
    model(X).sum().backward()
    used, _ = reducer.finish()                  # every gradient here: no read
    assert used == [0, 1, 2, 3]
    reducer.reset()
    reducer.prepare(len(X))
    model[0](X).sum().backward()                # the second layer unused here: its counts must be read
    with pytest.raises(NotImplementedError, match="meta"):
        reducer.finish()


def sparse_grads(rank, world):
    """An EmbeddingBag(sparse=True) beside a dense layer; the ranks look up different rows
    (some in common): the reducer's sum is DDP's, still sparse, over the union of the rows."""
    torch.manual_seed(0)

    def model():
        return torch.nn.Sequential(torch.nn.EmbeddingBag(20, 3, sparse=True), torch.nn.Linear(3, 2))
    ours, theirs = model(), model()
    theirs.load_state_dict(ours.state_dict())
    ddp = DistributedDataParallel(theirs)
    sparse = [0]                                            # the embedding's weight
    reducer = BucketReducer([list(ours.parameters())], get_collective(), sparse=sparse)
    X = torch.tensor([[1, 2, 3], [3, 4, 4]]) + 5 * rank     # rank 0: rows 1-4, rank 1: rows 6-9
    y = torch.tensor([0, 1])
    F.cross_entropy(ddp(X), y).backward()
    reducer.prepare(len(X))
    F.cross_entropy(ours(X), y, reduction="sum").backward()
    used, total = reducer.finish()
    reducer.scatter(0, used, 1.0 / total)
    got = ours[0].weight.grad
    rows = sorted(got.coalesce().indices()[0].tolist())
    return got.is_sparse, rows, [(a.grad.to_dense() - b.grad.to_dense()).abs().max().item()
                                 for a, b in zip(ours.parameters(), theirs.parameters())], sorted(used)


def test_sparse_gradients_are_summed_as_ddp_sums_them_and_stay_sparse():
    for is_sparse, rows, diffs, used in run_workers(sparse_grads):
        assert is_sparse and rows == [1, 2, 3, 4, 6, 7, 8, 9]
        assert max(diffs) < 1e-6 and used == [0, 1, 2]
