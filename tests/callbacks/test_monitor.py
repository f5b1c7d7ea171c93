"""``Monitor``: the mode a figure's name says, the best so far, Keras's and Lightning's names."""
import pytest

from dptrain.callbacks import Monitor


def test_monitor_modes_and_a_figure_that_is_not_there():
    assert Monitor("test_acc").mode == "max" and Monitor("test_loss").mode == "min"
    names = ("test_rare_recall", "test_f1", "test_top5", "train_accuracy", "test_mae", "test_word_error",
             "test_perplexity")
    assert [Monitor(name).mode for name in names] == ["max"] * 4 + ["min"] * 3
    for name, says in (("test_spread", "neither"), ("test_error_score", "both")):
        with pytest.raises(ValueError, match=f"cannot tell whether a larger {name} is better .its name says {says}.: "
                                             f"give mode='max' or mode='min'"):
            Monitor(name)
    assert Monitor("test_spread", mode="max").mode == "max"
    m = Monitor("test_loss", min_delta=0.1)
    assert m.improved(1, {"test_loss": 1.0}) and not m.improved(2, {"test_loss": 0.95})
    assert m.improved(3, {"test_loss": 0.8}) and (m.best, m.best_epoch) == (0.8, 3)
    assert not m.improved(4, {"test_loss": float("nan")})
    with pytest.raises(ValueError, match="monitor 'test_f1' is not in the epoch's figures .train_loss, test_loss."):
        Monitor("test_f1").value({"epoch": 1, "sec": 0.1, "train_loss": 1.0, "test_loss": 1.0})
    row = {"epoch": 1, "train_loss": 1.0, "test_loss": 1.0, "test_acc": 0.5}
    for peer, ours, mode in (("val_loss", "test_loss", "min"), ("val_accuracy", "test_acc", "max"),
                             ("val_acc", "test_acc", "max")):
        m = Monitor(peer)
        assert (m.mode, m.news(), m.value(row), m.monitor) == (mode, None, row[ours], ours)
        assert m.news() == f"{peer} (Keras's and Lightning's name) is watched as {ours}, the eval_data's figure here"
        assert m.news() is None                                     # said once
    m = Monitor("eval_loss")                                        # Hugging Face's
    assert (m.mode, m.value(row), m.news()) == ("min", 1.0, "eval_loss (Hugging Face's name) is watched as test_loss, "
                                                                  "the eval_data's figure here")
    assert Monitor("eval_accuracy").value({**row, "test_accuracy": 0.25}) == 0.25   # (its compute_metrics' key)
    m = Monitor("val_loss")                                         # a callback of the user's gives val_loss itself
    assert m.value({**row, "val_loss": 2.0}) == 2.0 and m.monitor == "val_loss" and m.news() is None
    with pytest.raises(ValueError, match="monitor 'val_f1' is not in the epoch's figures .train_loss, test_loss"):
        Monitor("val_f1", mode="max").value(row)
