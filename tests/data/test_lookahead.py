"""``Lookahead``: batches read one ahead, so the last is known as it is given; a failure
reading ahead is raised in its own turn."""
import pytest

from dptrain.data.lookahead import Lookahead


def test_the_last_batch_is_known_as_it_is_given():
    ahead = Lookahead(iter("abc"))
    seen = [(item, ahead.ended) for item in ahead]
    assert seen == [("a", False), ("b", False), ("c", True)] and ahead.ended
    empty = Lookahead(iter(()))
    assert list(empty) == [] and empty.ended


def test_a_failure_reading_ahead_comes_in_its_turn():
    read = []

    def batches():
        yield 1
        read.append("2 asked")
        raise OSError("the shard server went away")
    ahead = Lookahead(batches())
    assert next(ahead) == 1 and read == ["2 asked"] and not ahead.ended
    with pytest.raises(OSError, match="went away"):
        next(ahead)
