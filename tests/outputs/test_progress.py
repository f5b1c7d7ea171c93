"""How the epoch lines show a duration: tenths of a second, and a small model's short epochs
with two significant digits instead of ``0.0``."""
from dptrain.outputs.progress import seconds


def test_seconds_keep_two_digits_below_a_second():
    assert [seconds(v) for v in (7.94, 1.0, 0.96, 0.043, 0.00057, 0.0)] == ["7.9", "1.0", "1.0", "0.043",
                                                                           "0.00057", "0"]
