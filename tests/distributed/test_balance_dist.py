"""--balance across 2 processes: fixed weights and auto train as one device does on the global
batch, with accumulated micro-batches too, and every process cuts every batch the same way."""
import torch

from tests.distributed.helpers import run_workers
from tests.engine.test_balance import fit


def fit_balanced(rank, world):
    out = []
    halves = {"batch_size": 16, "accumulate_grad_batches": 2}     # (the same updates as batches of 32)
    for devices, balance, kw in (((2, 1), "1,3,2", {}), ((1, 1), "auto", {}), ((2, 1), "1,3,2", halves),
                                 ((1, 1), "auto", halves)):
        if world == 1 and kw:
            continue
        model, result = fit(devices[rank] if world > 1 else 1, balance if world > 1 else "even", epochs=2, **kw)
        out.append(([p.detach().tolist() for p in model.parameters()], [h.get("split") for h in result["history"]]))
    return out


def test_unequal_parts_over_two_processes_train_as_one_device():
    want = fit_balanced(0, 1)
    ranks = run_workers(fit_balanced)
    for (params, split), (want_params, _), total in zip(ranks[0], want * 2, (3, 2, 3, 2)):
        for p, q in zip(params, want_params):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
        assert all(len(s) == total and sum(s) in (32, 16) for s in split)
    assert ranks[0][0][1][0] == [5, 16, 11]       # 32 as 1:3:2 (5.3, 16, 10.7), over rank 0's two devices and rank 1's one
    for (p0, s0), (p1, s1) in zip(ranks[0], ranks[1]):
        assert s0 == s1 and p0 == p1
