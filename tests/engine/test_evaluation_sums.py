"""Evaluation's sums: CPU numbers added as they come (as Python numbers), others kept and
added every FOLD_EVERY values, counts of many batches at once: the same figures."""
import pytest
import torch

from dptrain.engine import evaluation
from dptrain.engine.class_counts import LazyCount, class_count, class_count_total


def test_values_folded_as_they_come_sum_to_the_exact_total(monkeypatch):
    monkeypatch.setattr(evaluation, "FOLD_EVERY", 4)
    loss = torch.nn.CrossEntropyLoss(ignore_index=0)
    g = torch.Generator().manual_seed(0)
    targets = [torch.randint(0, 3, (5,), generator=g) for _ in range(11)]
    out = {}
    given = [torch.tensor(0.5 * i) for i in range(11)]
    for i, t in enumerate(targets):
        evaluation.accumulate(out, "loss", given[i])
        evaluation.accumulate(out, "count", LazyCount(t, loss) if i % 2 else int((t != 0).sum()))
        evaluation.accumulate(out, "n", 5)
    assert len(out["loss"]) == 0 and len(out["count"]) < 4     # added at once on a CPU; folded along the way
    assert [g.item() for g in given] == [0.5 * i for i in range(11)]     # the values are left as they were
    assert evaluation.sum_values(out["loss"]).item() == sum(0.5 * i for i in range(11))
    assert evaluation.sum_values(out["count"]).item() == sum(int((t != 0).sum()) for t in targets)
    assert evaluation.sum_values(out["n"]).item() == 55.0
    assert evaluation.sum_values(out["loss"]).dtype == torch.float64


def test_gpu_like_tensors_are_kept_and_folded_and_cpu_ones_added_into_one_sum(monkeypatch):
    monkeypatch.setattr(evaluation, "FOLD_EVERY", 3)
    out = {}
    for i in range(7):          # the meta device stands for a GPU: its tensors are kept, not added
        evaluation.accumulate(out, "m", torch.empty((), device="meta"))
        evaluation.accumulate(out, "c", torch.tensor(i, dtype=torch.long))
    assert 0 < len(out["m"]) < 3 and out["m"].host == 0
    assert len(out["c"]) == 0 and type(out["c"].host) is int and out["c"].host == 21      # integers: exact


def test_float32_numbers_are_summed_in_float64():
    out = {}
    for value in [2.0 ** 24] + [1.0] * 10:      # in float32, 2**24 + 1 is 2**24: the ones would vanish
        evaluation.accumulate(out, "loss", torch.tensor(value, dtype=torch.float32))
    total = evaluation.sum_values(out["loss"])
    assert total.dtype == torch.float64 and total.item() == 2.0 ** 24 + 10


def test_counts_of_many_batches_at_once_equal_their_counts_one_by_one():
    weighted = torch.nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.0]), ignore_index=2)
    plain = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    targets = [torch.randint(0, 3, shape, generator=g) for shape in ((5,), (5,), (3,), (4, 3))]
    for losses in ([weighted] * 4, [plain] * 4, [weighted, plain, weighted, plain]):
        lazy = [LazyCount(t, loss) for t, loss in zip(targets, losses)]
        one_by_one = sum(float(class_count(t, loss)) for t, loss in zip(targets, losses))
        total = class_count_total(lazy)
        assert total.dtype == torch.float64 and total.item() == pytest.approx(one_by_one)
        float(lazy[1])                                      # one of them already counted
        assert class_count_total(lazy).item() == pytest.approx(one_by_one)
