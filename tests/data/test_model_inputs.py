"""How a batch meets the model by default: pairs, tuples, dicts and batch objects of one's
own, and the target each holds."""
import pytest
import torch

from dptrain.data.model_inputs import input_and_target, target_of


def test_the_default_forward_reads_pairs_tuples_and_dicts():
    x, m, y = torch.zeros(2, 3), torch.ones(2, 3), torch.arange(2)
    assert input_and_target((x, y))[1] is y
    (args, kwargs), target = input_and_target((x, m, y))
    assert args == (x, m) and kwargs == {} and target is y
    (args, kwargs), target = input_and_target({"image": x, "mask": m, "label": y})
    assert args == () and set(kwargs) == {"image", "mask"} and target is y
    with pytest.raises(ValueError, match="exactly one target key"):
        input_and_target({"image": x, "label": y, "y": y})
    with pytest.raises(ValueError, match="has no target"):
        input_and_target(x)


def test_a_batch_object_meets_the_model_whole_against_its_y():
    class Graphs:
        def __init__(self, y):
            self.y = y

        def to(self, device):
            return self
    batch = Graphs(torch.arange(3))
    assert input_and_target(batch) == (((batch,), {}), batch.y) and target_of(batch) is batch.y
    with pytest.raises(ValueError, match=r"a batch of one Graphs \(an object of your own\) has no target y: pass "
                                         r"forward=lambda model, batch: \(model\(batch\), batch.<its target>\)"):
        input_and_target(Graphs(None))
    assert target_of(Graphs(None)) is None
