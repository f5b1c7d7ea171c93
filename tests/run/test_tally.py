"""An epoch's loss sum and count, and each step's verdict, alike however they are kept."""
import math

import pytest
import torch
from torch import nn

from dptrain.engine.class_counts import LazyCount
from dptrain.engine.step_plan import StepResult
from dptrain.run.tally import Tally

# (the loss, as train_batch reports it: a sum, or a mean with mean=True; its count)
STEPS = [(6.0, 3, False), (2.5, 4, True), (1.0, 2.0, False), (0.5, torch.tensor(8.0), True)]


def result(value, count, mean):
    return StepResult(torch.tensor(value, dtype=torch.float64), count, mean=mean)


@pytest.mark.parametrize("on_host", [True, False])
def test_the_sum_and_count_are_the_steps_sums_and_counts(on_host):
    tally = Tally(torch.device("cpu"), on_host=on_host)
    verdicts = [tally.add(result(*step)) for step in STEPS]
    assert all(Tally.finite(v) for v in verdicts)
    if on_host:         # read at once: the verdict is the loss as reported
        assert verdicts == [6.0, 2.5, 1.0, 0.5]
    loss_sum, count = tally.numbers()
    assert loss_sum == pytest.approx(6.0 + 2.5 * 4 + 1.0 + 0.5 * 8)
    assert count == pytest.approx(3 + 4 + 2 + 8)


@pytest.mark.parametrize("on_host", [True, False])
def test_a_non_finite_step_has_a_non_finite_verdict(on_host):
    tally = Tally(torch.device("cpu"), on_host=on_host)
    assert Tally.finite(tally.add(result(1.0, 2, False)))
    assert not Tally.finite(tally.add(result(math.nan, 2, True)))
    assert math.isnan(tally.numbers()[0])


@pytest.mark.parametrize("on_host", [True, False])
def test_lazy_class_counts_are_counted_when_folded(on_host):
    """A classifier's mean loss, counted later for many steps at once."""
    loss = nn.CrossEntropyLoss(ignore_index=0)
    tally = Tally(torch.device("cpu"), on_host=on_host)
    targets = [torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0, 0, 3])]      # 3 and 2 targets kept
    for value, target in zip((1.5, 4.0), targets):
        tally.add(result(value, LazyCount(target, loss), True))
    assert tally.numbers() == (pytest.approx(1.5 * 3 + 4.0 * 2), pytest.approx(5.0))
