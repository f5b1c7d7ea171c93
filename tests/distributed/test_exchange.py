"""The exchange sum (distributed/exchange.py) against gloo's all_reduce, and when it is used."""
import torch
import torch.distributed as dist

from dptrain.distributed import exchange
from dptrain.distributed.collective import TorchCollective
from dptrain.distributed.exchange import ExchangeWork, worth_exchanging
from tests.distributed.helpers import run_workers

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64]


def _tensor(rank, dtype, n=1000):
    g = torch.Generator().manual_seed(10 + rank)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 10 ** (3 * rank)).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)


def against_gloo(rank, world):
    out = []
    for dtype in DTYPES:
        mine = _tensor(rank, dtype)
        theirs = mine.clone()
        ExchangeWork(mine, None).wait()
        dist.all_reduce(theirs)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        out.append((torch.equal(mine, theirs), all(torch.equal(e, mine) for e in everyone)))
    return out


def test_two_processes_get_gloos_bits_for_every_dtype():
    for rows in run_workers(against_gloo):
        assert rows == [(True, True)] * len(DTYPES)


def in_flight(rank, world):
    """Three sums started before any is waited on (buckets launched during backward), then a
    collective in between, then the waits: each gets its own sum."""
    collective = TorchCollective()
    tensors = [torch.full((n,), float(rank + 1) * (k + 1)) for k, n in enumerate([5, 50_000, 7])]
    works = [collective.all_reduce_async(t) for t in tensors]
    kinds = [type(w).__name__ for w in works]
    flag = collective.all_reduce(torch.tensor([float(rank)]))
    for w in works:
        w.wait()
    big = torch.ones(exchange.MAX_BYTES // 4 + 1)           # over the limit: gloo's ring
    work = collective.all_reduce_async(big)
    kinds.append(type(work).__name__)
    work.wait()
    return [t.unique().tolist() for t in tensors + [big]], flag.tolist(), kinds


def test_sums_in_flight_together_each_get_their_own():
    for sums, flag, kinds in run_workers(in_flight):
        assert sums == [[3.0], [6.0], [9.0], [2.0]]               # (1 + 2) x (k + 1); 1 + 1
        assert flag == [1.0]
        assert kinds[:3] == ["ExchangeWork"] * 3 and kinds[3] != "ExchangeWork"


def three(rank, world):
    mine = _tensor(rank, torch.float32)
    parts = [_tensor(r, torch.float32) for r in range(world)]
    expected = (parts[0] + parts[1]) + parts[2]                   # rank order
    reference = mine.clone()
    dist.all_reduce(reference)
    pair = dist.new_group([1, 2])              # a sub-group: peers named by their global ranks
    sub = _tensor(rank, torch.float64)
    if rank > 0:
        ExchangeWork(sub, pair).wait()
    ExchangeWork(mine, None).wait()
    return (torch.equal(mine, expected), torch.allclose(mine, reference, rtol=1e-6, atol=1e-3),
            torch.equal(sub, _tensor(1, torch.float64) + _tensor(2, torch.float64)) if rank else None)


def test_three_processes_add_in_rank_order_and_agree():
    # world_size 3 (not the usual 2): only then does the order of the additions matter.
    results = run_workers(three, world_size=3)
    assert [r[:2] for r in results] == [(True, True)] * 3
    assert [r[2] for r in results[1:]] == [True, True]


def test_only_small_contiguous_cpu_tensors_are_exchanged():
    small = torch.zeros(1000)
    assert worth_exchanging(small, 2)
    assert not worth_exchanging(small, 1)                           # nothing to exchange
    assert not worth_exchanging(torch.zeros(1000, 2).t(), 2)        # not contiguous
    assert not worth_exchanging(torch.zeros(1000, device="meta"), 2)  # not on the CPU
    at_limit = torch.zeros(exchange.MAX_BYTES // 4)
    assert worth_exchanging(at_limit, 2) and not worth_exchanging(at_limit, 3)   # (W - 1) x bytes


def objects(rank, world):
    """Objects of other sizes on each rank (a 5-element and a 100,005-element tensor), through
    the collective, with torch's all_gather_object made to fail: gloo gathers point to point."""
    def refuse(*args, **kwargs):
        raise AssertionError("dist.all_gather_object was called")
    dist.all_gather_object = refuse
    mine = {"rank": rank, "t": torch.arange(rank * 100_000 + 5), "nested": [rank] * rank}
    got = TorchCollective().all_gather_object(mine)
    return [(o["rank"], o["t"].numel(), int(o["t"][-1]), o["nested"]) for o in got]


def test_objects_are_gathered_point_to_point_in_rank_order():
    """(dist.all_gather_object's worker threads could abort a script exiting just after it.)"""
    want = [(0, 5, 4, []), (1, 100_005, 100_004, [1])]
    assert run_workers(objects) == [want, want]
