"""How the epoch lines show a duration: tenths of a second, and a small model's short epochs
with two significant digits instead of ``0.0``."""
import io

from dptrain.outputs.progress import ProgressBar, seconds


def test_seconds_keep_two_digits_below_a_second():
    assert [seconds(v) for v in (7.94, 1.0, 0.96, 0.043, 0.00057, 0.0)] == ["7.9", "1.0", "1.0", "0.043",
                                                                           "0.00057", "0"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_of_unknown_length_counts_the_batches():
    out = Terminal()
    bar = ProgressBar(None, 2, stream=out)
    bar.last -= 1           # (it draws at most every 0.1 s)
    bar.update(3, 96, loss=0.5)
    assert "epoch 2  3 batches" in out.getvalue() and "loss 0.500" in out.getvalue() and "[" not in out.getvalue()
    out = Terminal()
    ProgressBar(4, 1, stream=out).update(4, 128)
    assert "[" + "#" * 24 + "] 4/4" in out.getvalue()
