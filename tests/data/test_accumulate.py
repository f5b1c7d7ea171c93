"""``Accumulating``: a loader's batches in groups of k, one group per update, resumable."""
import pytest
import torch

from dptrain.data.accumulate import Accumulating, MicroBatches
from dptrain.data.loader import TensorLoader


def test_groups_of_k_with_a_smaller_last_group_and_their_sizes():
    loader = TensorLoader(torch.arange(23), batch_size=4)      # batches of 4,4,4,4,4,3
    steps = Accumulating(loader, 4)
    groups = list(steps.batches())
    assert len(steps) == 2 and all(isinstance(g, MicroBatches) for g in groups)
    assert [[b.tolist() for b in g] for g in groups][1] == [[16, 17, 18, 19], [20, 21, 22]]
    assert [steps.global_batch_size(s) for s in range(2)] == [16, 7]
    assert torch.cat([b for g in groups for b in g]).tolist() == list(range(23))
    assert steps.global_num_samples == 23 and steps.batch_size == 4      # asked of the loader


def test_the_groups_of_a_stream_without_a_length_have_the_sizes_read():
    from tests.data.test_stream_loader import Numbers
    from dptrain.data.stream_loader import StreamLoader
    steps = Accumulating(StreamLoader(Numbers(23), 4), 4)       # batches of 4,4,4,4,4,3
    groups = list(steps.batches())
    assert [len(g) for g in groups] == [4, 2]
    assert [steps.global_batch_sizes(s) for s in range(2)] == [[4, 4, 4, 4], [4, 3]]
    assert [steps.global_samples(s) for s in range(3)] == [0, 16, 23]


def test_resuming_at_a_group_skips_its_micro_batches():
    loader = TensorLoader(torch.arange(20), batch_size=2, shuffle=True, seed=3)
    steps = Accumulating(loader, 3)
    steps.set_epoch(1)
    whole = [[b.tolist() for b in g] for g in steps.batches()]
    assert [[b.tolist() for b in g] for g in steps.batches(2)] == whole[2:]


@pytest.mark.parametrize("k", [0, 1.5, True])
def test_a_bad_count_is_refused(k):
    with pytest.raises(ValueError, match="accumulate_grad_batches must be a whole number"):
        Accumulating(TensorLoader(torch.arange(4), 2), k)
