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


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 10, 256])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_with_a_least_size_no_part_is_smaller_unless_the_whole_is(n, k):
    """BatchNorm's rule (least=2): parts of 0 or >= 2, as even as that allows, in order."""
    sizes = even_parts(n, k, least=2)
    assert sum(sizes) == n and len(sizes) == k and sizes == sorted(sizes, reverse=True)
    assert all(s == 0 or s >= 2 for s in sizes) or n < 2
    assert sizes == (even_parts(n, k) if n >= 2 * k else even_parts(n, max(1, n // 2)) + [0] * (k - max(1, n // 2)))
    starts = [even_part(n, k, i, least=2) for i in range(k)]
    assert [j for start, size in starts for j in range(start, start + size)] == list(range(n))
    assert [size for _, size in starts] == sizes


def test_a_small_last_batch_goes_to_fewer_parts_with_a_least_size():
    assert even_parts(3, 2, least=2) == [3, 0] and even_parts(5, 4, least=2) == [3, 2, 0, 0]
    assert even_parts(1, 2, least=2) == [1, 0] and even_parts(4, 2, least=2) == [2, 2]


def test_weighted_parts_follow_the_weights_and_keep_a_floor():
    assert weighted_parts(10, [3, 1]) == [8, 2]
    assert weighted_parts(100, [1, 0], least=1) == [99, 1]
    assert weighted_parts(1, [1, 1], least=1) == [1, 0]          # too few samples for the floor
    for n in (0, 5, 97):
        assert sum(weighted_parts(n, [0.2, 0.5, 0.3])) == n
