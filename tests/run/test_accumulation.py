"""``fit(accumulate_grad_batches=k)``: k micro-batches make the update one batch k times as
large makes, on any number of devices, for every loss reduction; resumable mid-epoch."""
import functools
import signal

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.core.errors import Interrupted


def data(n=203, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 8, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    y[::7] = -100                           # ignored labels: the denominator is a count of the rest
    return X, y


def train(devices, batch_size, k, loss=None, seen=None, **kw):
    """``seen``: a list to which every training forward, on any device, adds its batch size."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.0), nn.Linear(16, 3))
    if seen is not None:        # (each replica is a copy of the model, with its hooks)
        model.register_forward_hook(lambda module, args, out: seen.append(len(args[0])) if module.training else None)
    if "step" not in kw:
        kw["loss"] = loss or nn.CrossEntropyLoss()
    result = dptrain.fit(model, data(), data(50, seed=2), epochs=2,
                         batch_size=batch_size, accumulate_grad_batches=k, devices=devices,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), log=None, **kw)
    return model, result


def assert_same(a, b):
    (ma, ra), (mb, rb) = a, b
    for p, q in zip(ma.parameters(), mb.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)   # float32 sums in another order
    for x, y in zip(ra["history"], rb["history"]):
        assert y["train_loss"] == pytest.approx(x["train_loss"], rel=1e-5)
        assert y["test_loss"] == pytest.approx(x["test_loss"], rel=1e-5)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_four_micro_batches_equal_one_batch_four_times_as_large(devices):
    # 203 samples: batches of 64 (64, 64, 64, 11) against micro-batches of 16 in groups of 4.
    assert_same(train(1, 64, 1), train(devices, 16, 4))


@pytest.mark.parametrize("loss, kw", [
    (nn.CrossEntropyLoss(reduction="sum"), {}),
    (None, {"clip_grad_norm": 0.05}),
    (F.cross_entropy, {"forward": lambda model, batch: (model(batch[0]), batch[1])}),   # counted per shard
])
def test_every_reduction_and_clipping_accumulate_exactly(loss, kw):
    assert_same(train(1, 48, 1, loss, **kw), train(2, 16, 3, loss, **kw))


def test_a_step_function_accumulates_as_its_mean_says():
    def step(model, batch):
        X, y = batch
        keep = y >= 0
        return F.cross_entropy(model(X[keep]), y[keep], reduction="sum"), keep.sum()
    assert_same(train(1, 40, 1, step=step), train(2, 10, 4, step=step))


class Interrupt(dptrain.Callback):
    """Ctrl-C, as a user would press it, after update ``at`` of epoch 1."""

    def __init__(self, at):
        self.at = at

    def on_batch_end(self, run, end):
        if end.epoch == 1 and end.batch == self.at:
            signal.raise_signal(signal.SIGINT)


def test_a_run_stopped_between_updates_resumes_bit_identical(tmp_path):
    whole = train(2, 16, 4, checkpoint_dir=str(tmp_path / "a"))
    with pytest.raises(Interrupted, match="epoch 1, batch 2"):
        train(2, 16, 4, checkpoint_dir=str(tmp_path / "b"), callbacks=[Interrupt(2)])
    resumed = train(2, 16, 4, checkpoint_dir=str(tmp_path / "b"), resume=True)
    for p, q in zip(whole[0].parameters(), resumed[0].parameters()):
        assert torch.equal(p, q)
    assert whole[1]["history"] == [{**row, "sec": whole[1]["history"][i]["sec"]}
                                   for i, row in enumerate(resumed[1]["history"])]


@pytest.mark.parametrize("balance", ["1,3", "auto"])
def test_micro_batches_split_unequally_equal_one_batch_four_times_as_large(balance):
    """--balance: each micro-batch of a group cut by the update's weights (1:3: 4 and 12 of 16,
    3 and 8 of the last, 11)."""
    seen = []
    assert_same(train(1, 64, 1), train(2, 16, 4, balance=balance, seen=seen))
    if balance == "1,3":
        assert set(seen) == {4, 12, 3, 8}, seen
