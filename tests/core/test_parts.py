"""Cutting n samples into parts covers each sample once, in order, whatever n and k."""
import pytest

from dptrain.core.parts import even_part, even_parts, weighted_parts


@pytest.mark.parametrize("n", [0, 1, 7, 10, 256, 1001])
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_even_parts_cover_every_sample_once_and_differ_by_at_most_one(n, k):
    sizes = even_parts(n, k)
    assert sum(sizes) == n and len(sizes) == k and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)                 # the first parts get the extra samples
    starts = [even_part(n, k, i) for i in range(k)]
    covered = [j for start, size in starts for j in range(start, start + size)]
    assert covered == list(range(n))                            # consecutive, in order, no gap or overlap
    assert [size for _, size in starts] == sizes


def test_weighted_parts_follow_the_weights_and_keep_a_floor():
    assert weighted_parts(10, [3, 1]) == [8, 2]
    assert weighted_parts(100, [1, 0], least=1) == [99, 1]
    assert weighted_parts(1, [1, 1], least=1) == [1, 0]          # too few samples for the floor
    for n in (0, 5, 97):
        assert sum(weighted_parts(n, [0.2, 0.5, 0.3])) == n
