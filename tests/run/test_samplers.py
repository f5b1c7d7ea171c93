"""``fit`` with a ``DataLoader`` whose sampler picks the samples (``WeightedRandomSampler``
for imbalanced classes, ``SubsetRandomSampler``) or whose batch sampler makes the batches
(bucketed by length): its draw, by ``(seed, epoch)``, cut into the global batches, the same on
any number of devices; a resume mid-epoch is exact."""
import functools

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

import dptrain
from tests.data.test_dataset_loader import Buckets

X = torch.randn(120, 8, generator=torch.Generator().manual_seed(2))
Y = (X[:, :3].sum(1) > 0).long() + (X[:, 3] > 1).long()
#: the rare class 2 weighted 5 times the others; samples 100-119 never drawn
WEIGHTS = [0.0 if i >= 100 else 5.0 if Y[i] == 2 else 1.0 for i in range(120)]


class Recorded(Dataset):
    """X, Y, noting which samples were read."""

    def __init__(self):
        self.read = []

    def __len__(self):
        return 120

    def __getitem__(self, i):
        self.read.append(i)
        return X[i], Y[i]


def weighted(data):
    return DataLoader(data, batch_size=16, sampler=WeightedRandomSampler(WEIGHTS, 80))


def train(data, devices=1, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    kw.setdefault("log", None)
    kw.setdefault("epochs", 3)
    result = dptrain.fit(model, data, (X[:40], Y[:40]), devices=devices,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), **kw)
    return model, result


def figures(result):
    return [v for r in result["history"] for k, v in r.items() if k not in ("sec", "images_per_sec")]


def test_a_weighted_sampler_draws_each_epoch_by_its_weights_alike_on_any_number_of_devices():
    data = Recorded()
    want_model, want = train(weighted(data))
    read = data.read[-240:]                     # (before them: sample 0, read to show the model its input)
    assert len(data.read) <= 242 and max(read) < 100          # 80 draws an epoch, none of weight 0
    assert sum(Y[i] == 2 for i in read) > sum(Y[:100] == 2) * 3 * 80 / 100      # the rare class drawn more
    epochs = [read[k * 80:(k + 1) * 80] for k in range(3)]
    assert epochs[0] != epochs[1]
    data.read.clear()
    train(weighted(data))
    read = data.read[-240:]
    assert [read[k * 80:(k + 1) * 80] for k in range(3)] == epochs      # by (seed, epoch): the same run again
    for devices in (2, 3):
        model, result = train(weighted(Recorded()), devices)
        assert figures(result) == pytest.approx(figures(want), rel=1e-5)
        for p, q in zip(model.parameters(), want_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_run_with_a_sampler_stopped_mid_epoch_resumes_as_the_unbroken_run(tmp_path):
    whole, whole_result = train(weighted(Recorded()), 2, max_steps=12)        # 5 batches an epoch
    train(weighted(Recorded()), 2, max_steps=7, checkpoint_dir=str(tmp_path))
    resumed, result = train(weighted(Recorded()), 2, max_steps=12, checkpoint_dir=str(tmp_path), resume=True)
    assert figures(result) == figures(whole_result)
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_validation_split_with_a_sampler_is_refused():
    with pytest.raises(ValueError, match="validation_split with the DataLoader's WeightedRandomSampler"):
        dptrain.fit(nn.Linear(8, 3), weighted(Recorded()), validation_split=0.2, log=None)


def test_a_batch_sampler_makes_the_batches_alike_on_any_number_of_devices_and_resumes(tmp_path):
    """Batches of 7, 13 and 10 samples (a bucketing sampler's uneven sizes): the steps one
    device takes on them, on 2 and 3 devices; cut mid-epoch and resumed, bit for bit."""
    def bucketed():
        return DataLoader(Recorded(), batch_sampler=Buckets(120))
    want_model, want = train(bucketed())
    assert [r["epoch"] for r in want["history"]] == [1, 2, 3]
    for devices in (2, 3):
        model, result = train(bucketed(), devices)
        assert figures(result) == pytest.approx(figures(want), rel=1e-5)
        for p, q in zip(model.parameters(), want_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    whole, whole_result = train(bucketed(), 2, max_steps=30)            # 12 batches an epoch
    train(bucketed(), 2, max_steps=17, checkpoint_dir=str(tmp_path))
    resumed, result = train(bucketed(), 2, max_steps=30, checkpoint_dir=str(tmp_path), resume=True)
    assert figures(result) == figures(whole_result) and result["history"][-1]["samples"] == 60
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_a_batch_size_given_beside_a_batch_sampler_is_said_to_be_unused():
    lines = []
    train(DataLoader(Recorded(), batch_sampler=Buckets(120)), epochs=1, batch_size=32, log=lines.append)
    assert "dptrain: batch_size=32 is not used: the DataLoader's Buckets makes the batches" in lines, lines
