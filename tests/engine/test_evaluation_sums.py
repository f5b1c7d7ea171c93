"""Evaluation's sums are kept as they come and added every FOLD_EVERY values: the same figure."""
import torch

from dptrain.engine import evaluation
from dptrain.engine.class_counts import LazyCount


def test_values_folded_as_they_come_sum_to_the_exact_total(monkeypatch):
    monkeypatch.setattr(evaluation, "FOLD_EVERY", 4)
    loss = torch.nn.CrossEntropyLoss(ignore_index=0)
    g = torch.Generator().manual_seed(0)
    targets = [torch.randint(0, 3, (5,), generator=g) for _ in range(11)]
    out = {}
    for i, t in enumerate(targets):
        evaluation._accumulate(out, "loss", torch.tensor(0.5 * i))
        evaluation._accumulate(out, "count", LazyCount(t, loss) if i % 2 else int((t != 0).sum()))
        evaluation._accumulate(out, "n", 5)
    assert len(out["loss"]) < 4                        # folded along the way, not kept whole
    assert evaluation._total(out["loss"]).item() == sum(0.5 * i for i in range(11))
    assert evaluation._total(out["count"]).item() == sum(int((t != 0).sum()) for t in targets)
    assert evaluation._total(out["n"]).item() == 55.0
    assert evaluation._total(out["loss"]).dtype == torch.float64
