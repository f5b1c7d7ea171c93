"""dptrain's bucketed, hook-launched allreduce gives DistributedDataParallel's gradients."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dptrain.distributed.collective import get_collective
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
    reducer.prepare(len(X), extras=torch.tensor([float(rank), 1.0, 2.0 * rank]))   # they ride along
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
