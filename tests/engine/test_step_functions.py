"""A step function's loss read in each form it may return, and its denominator known from
the batch once the function has run (per function: several optimizers' steps differ)."""
import contextlib
import re

import pytest
import torch
from torch import nn

from dptrain.engine.step_functions import StepFunctions

NONE = contextlib.nullcontext()
NET = nn.Linear(3, 1)
BATCH = (torch.randn(5, 3), torch.randn(5, 1))


def mean_step(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1])


def pair_step(net, batch):
    return nn.functional.mse_loss(net(batch[0]), batch[1], reduction="sum"), 10


def test_a_mean_is_read_with_the_samples_as_its_count_and_then_known_from_the_batch():
    steps = StepFunctions(mean_step, None)
    assert steps.known_count(BATCH) == (False, None)        # not run yet: its form is unknown
    value, count, output, mean = steps.loss(NET, BATCH, NONE)
    assert count == 5 and mean and output is None
    summed, count, _ = steps.sum_loss(NET, BATCH, NONE)
    torch.testing.assert_close(summed, value * 5)
    assert steps.known_count(BATCH) == (True, 5)


def test_sum_and_pair_forms_and_each_function_remembered_apart():
    steps = StepFunctions(None, None)          # several: each call names its step
    _, count, _, mean = steps.loss(NET, BATCH, NONE, pair_step)
    assert (count, mean) == (10, False)
    assert steps.known_count(BATCH, pair_step) == (False, None)     # counted by the step itself
    assert steps.known_count(BATCH, mean_step) == (False, None)     # never run
    steps.loss(NET, BATCH, NONE, mean_step)
    assert steps.known_count(BATCH, mean_step) == (True, 5)
    summing = StepFunctions(mean_step, "sum")
    summing.loss(NET, BATCH, NONE)
    assert summing.known_count(BATCH) == (True, None)          # a sum: nothing to divide by here


@pytest.mark.parametrize("returned, said", [((1.0, 2.0, 3.0), "step returned 3 values"),
                                            (torch.ones(2), "step must return the loss (one number)")])
def test_other_returns_are_refused_naming_the_forms(returned, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        StepFunctions(lambda net, batch: returned, None).loss(NET, BATCH, NONE)
