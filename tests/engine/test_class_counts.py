"""Cross-entropy's count: a LazyCount per step, or the targets' number when the training
targets were read once and none of them is ignored."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.class_counts import LazyCount, none_ignored
from dptrain.engine.losses import LossAdapter

BATCH = 8


@pytest.mark.parametrize("loss, targets, expected", [
    (nn.CrossEntropyLoss(), torch.tensor([0, 1, 2, 3]), True),
    (nn.CrossEntropyLoss(), torch.tensor([0, -100, 2]), False),          # the default ignore_index
    (nn.CrossEntropyLoss(ignore_index=0), torch.tensor([0, 1, 2]), False),
    (nn.CrossEntropyLoss(ignore_index=0), torch.tensor([[1, 2], [3, 1]]), True),
    (nn.CrossEntropyLoss(weight=torch.ones(4)), torch.tensor([0, 1]), False),    # a mean over weights
    (nn.CrossEntropyLoss(), torch.rand(3, 4), False),                    # class probabilities
    (nn.NLLLoss(), torch.tensor([1, 2]), True),
    (nn.MSELoss(), torch.tensor([1, 2]), False),                          # no ignore_index
])
def test_none_ignored_reads_the_whole_target_column(loss, targets, expected):
    assert none_ignored(loss, targets) is expected


def test_whole_counts_by_number_only_when_every_target_counts():
    output, target = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    adapter = LossAdapter(nn.CrossEntropyLoss(ignore_index=2))
    adapter.count_from(torch.tensor([0, 1, 1, 0]))          # (another column: none is 2)
    value, count = adapter.whole(output, target)
    assert count == 4 and isinstance(count, int)
    adapter.count_from(torch.tensor([0, 2, 1]))
    value, count = adapter.whole(output, target)
    assert isinstance(count, LazyCount) and float(count) == 3.0
    assert value == pytest.approx(float(nn.CrossEntropyLoss(ignore_index=2)(output, target)))
    weighted = LossAdapter(nn.CrossEntropyLoss(), class_weight=[1.0, 2.0, 1.0])
    weighted.count_from(target)
    assert not weighted.all_counted                          # (Keras's weighing: its own count)


def _epoch_loss(y, ignore_index):
    """One epoch at lr 0 (the model stays as it is): fit's train_loss, the mean over the
    kept targets computed at once, and whether the steps counted by number."""
    seen = []

    class Look(dptrain.Callback):
        def on_fit_start(self, run):
            seen.append(run.engine.adapter.all_counted)
    torch.manual_seed(0)
    X = torch.randn(len(y), 5)
    model = nn.Linear(5, 3)
    loss = nn.CrossEntropyLoss(ignore_index=ignore_index)
    result = dptrain.fit(model, (X, y), loss=loss, optimizer="sgd", lr=0.0, epochs=1, batch_size=BATCH,
                         shuffle=False, devices=1, log=None, progress=False, callbacks=[Look()])
    with torch.no_grad():
        whole = nn.CrossEntropyLoss(ignore_index=ignore_index, reduction="sum")(model(X), y) / (y != ignore_index).sum()
    return result["history"][0]["train_loss"], float(whole), seen[0]


def test_the_epoch_loss_is_the_mean_over_kept_targets_with_ignored_targets_in_memory():
    y = torch.tensor([1, 2] * 12)
    y[:6] = 0           # the first batch keeps 2 of 8 targets, the others 8: a count by numbers would be wrong
    fit_loss, exact, by_number = _epoch_loss(y, ignore_index=0)
    assert fit_loss == pytest.approx(exact, rel=1e-6) and not by_number


def test_the_epoch_loss_with_no_ignored_target_counts_every_target():
    y = torch.tensor([0, 1, 2] * 7)         # 21: a last batch of 5
    fit_loss, exact, by_number = _epoch_loss(y, ignore_index=-100)
    assert fit_loss == pytest.approx(exact, rel=1e-6) and by_number
