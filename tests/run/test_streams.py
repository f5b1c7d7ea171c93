"""``fit``, ``evaluate`` and ``predict`` on a stream (an ``IterableDataset``): the steps of
the same samples given as tensors, on any number of devices; a resumed run reads on where it
stopped, its random numbers included; an epoch of one without a length is a pass read to its
end, as Keras and Lightning read it."""
import functools
import itertools

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import dptrain

X = torch.randn(90, 8, generator=torch.Generator().manual_seed(1))
Y = (X[:, :3].sum(1) > 0).long() + (X[:, 3] > 1).long()


class Samples(IterableDataset):
    """The rows of X, Y in order (or, after ``set_epoch(e)``, by a permutation of ``e``), with
    ``noise * torch.randn`` added as they are read; every worker reads its share."""

    def __init__(self, noise=0.0, shuffled=False, n=90):
        self.noise, self.shuffled, self.n, self.epoch = noise, shuffled, n, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def order(self):
        if not self.shuffled:
            return list(range(self.n))
        return torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()

    def __iter__(self):
        worker = get_worker_info()
        order = self.order()
        for i in order if worker is None else order[worker.id::worker.num_workers]:
            yield X[i] + self.noise * torch.randn(8), Y[i]


class SizedSamples(Samples):
    def __len__(self):
        return self.n


def train(data, devices=1, dropout=0.1, eval_data=(X[:40], Y[:40]), **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(dropout), nn.ReLU(), nn.Linear(16, 3))
    kw.setdefault("log", None)
    kw.setdefault("epochs", 3)
    result = dptrain.fit(model, data, eval_data, batch_size=20, devices=devices,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), **kw)
    return model, result


def rows(result):
    return [{k: v for k, v in r.items() if k not in ("sec", "images_per_sec")} for r in result["history"]]


def figures(result):
    return [v for r in rows(result) for v in r.values()]


def test_a_stream_trains_as_its_samples_given_as_tensors_on_any_number_of_devices():
    want_model, want = train((X, Y), shuffle=False, dropout=0)
    for devices in (1, 2, 3):
        model, result = train(SizedSamples(), devices, dropout=0)
        assert [r["epoch"] for r in result["history"]] == [1, 2, 3]
        if devices == 1:
            assert rows(result) == rows(want)
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), want_model.parameters()))
        assert figures(result) == pytest.approx(figures(want), rel=1e-5)
        for p, q in zip(model.parameters(), want_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_run_stopped_mid_epoch_resumes_reading_the_stream_where_it_stopped(tmp_path, devices):
    """A stream that draws random numbers (and shuffles by epoch); the run cut by max_steps
    mid-epoch, then resumed: the unbroken run's weights, bit for bit."""
    stream = functools.partial(SizedSamples, noise=0.1, shuffled=True)
    whole, whole_result = train(stream(), devices, max_steps=11)       # 5 batches an epoch
    train(stream(), devices, max_steps=7, checkpoint_dir=str(tmp_path))
    resumed, result = train(stream(), devices, max_steps=11, checkpoint_dir=str(tmp_path), resume=True)
    assert rows(result) == rows(whole_result)
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_steps_per_epoch_trains_an_endless_stream_and_resumes_on_it(tmp_path):
    whole, whole_result = train(Endless(), 2, steps_per_epoch=4, epochs=3)
    assert [r["epoch"] for r in whole_result["history"]] == [1, 2, 3]
    train(Endless(), 2, steps_per_epoch=4, epochs=3, max_steps=6, checkpoint_dir=str(tmp_path))
    resumed, result = train(Endless(), 2, steps_per_epoch=4, epochs=3, checkpoint_dir=str(tmp_path), resume=True)
    assert rows(result) == rows(whole_result)
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_workers_read_a_stream_that_shards_itself_by_worker():
    _, one = train(DataLoader(SizedSamples(), batch_size=20, num_workers=2), 1, epochs=1, dropout=0)
    _, two = train(DataLoader(SizedSamples(), batch_size=20, num_workers=2), 2, epochs=1, dropout=0)
    assert figures(one) == pytest.approx(figures(two), rel=1e-5)
    assert one["history"][0]["train_loss"] > 0


def test_the_order_is_said_and_steps_per_epoch_is_for_streams():
    lines = []
    train(SizedSamples(), epochs=1, log=lines.append)
    assert any("SizedSamples is a stream, read in the order it yields" in line for line in lines), lines
    lines.clear()
    train(SizedSamples(), epochs=1, log=lines.append, shuffle=False)
    assert not any("is a stream" in line for line in lines)
    with pytest.raises(ValueError, match="steps_per_epoch counts the epochs of a stream"):
        train((X, Y), steps_per_epoch=3)


def without_length(row):
    return {k: v for k, v in row.items() if k not in ("batches", "samples")}


@pytest.mark.parametrize("devices,accumulate", [(1, 1), (2, 1), (3, 2)])
def test_a_stream_without_a_length_trains_a_pass_an_epoch_as_the_same_stream_with_one(devices, accumulate):
    """Keras's and Lightning's epoch of such a stream: read to its end (90 samples: 4 batches
    of 20 and one of 10); the rows say the batches and samples each epoch had."""
    stream = functools.partial(Samples, noise=0.1, shuffled=True)
    lines = []
    model, result = train(stream(), devices, log=lines.append, accumulate_grad_batches=accumulate)
    sized, sized_result = train(SizedSamples(noise=0.1, shuffled=True), devices, accumulate_grad_batches=accumulate)
    assert [without_length(r) for r in rows(result)] == rows(sized_result)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), sized.parameters()))
    assert [(r["batches"], r["samples"]) for r in result["history"]] == [(5 if accumulate == 1 else 3, 90)] * 3
    assert result["epochs"] == 3 and result["images_per_sec"] > 0
    assert any("Samples has no __len__: an epoch is a pass of it read to its end" in line for line in lines), lines
    assert any(line.startswith("epoch 2,") and line.endswith(f", {5 if accumulate == 1 else 3} batches")
               for line in lines), lines


def test_drop_last_leaves_the_short_last_batch_of_a_stream_without_a_length():
    model, result = train(Samples(noise=0.1), 2, drop_last=True, epochs=2)
    sized, sized_result = train(SizedSamples(noise=0.1), 2, drop_last=True, epochs=2)
    assert [(r["batches"], r["samples"]) for r in result["history"]] == [(4, 80)] * 2
    assert [without_length(r) for r in rows(result)] == rows(sized_result)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), sized.parameters()))


class Endless(IterableDataset):
    def __iter__(self):
        i = 0
        while True:
            yield X[i % 90] + 0.1 * torch.randn(8), Y[i % 90]
            i += 1


def test_max_steps_ends_a_run_on_an_endless_stream_and_on_a_pass_end_it_ends_the_epoch_whole(tmp_path):
    lines = []
    _, result = train(Endless(), 2, epochs=None, max_steps=7, log=lines.append)
    assert [(r["epoch"], r["batches"], r["samples"]) for r in result["history"]] == [(1, 7, 140)]
    assert result["epochs"] == 1 and any("7 batches (max_steps)" in line for line in lines), lines
    # 10 updates: two passes of 5, whole (no cut): then 15, resumed, as an unbroken run of 15
    stream = functools.partial(Samples, noise=0.1, shuffled=True)
    _, ten = train(stream(), 2, epochs=None, max_steps=10, checkpoint_dir=str(tmp_path))
    assert [(r["epoch"], r["batches"]) for r in ten["history"]] == [(1, 5), (2, 5)] and ten["epochs"] == 2
    resumed, result = train(stream(), 2, epochs=None, max_steps=15, checkpoint_dir=str(tmp_path), resume=True)
    whole, whole_result = train(stream(), 2, epochs=None, max_steps=15)
    assert rows(result) == rows(whole_result) and result["epochs"] == 3
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(), whole.parameters()))


@pytest.mark.parametrize("devices", [1, 2])
def test_a_run_on_a_stream_without_a_length_stopped_mid_epoch_resumes_where_it_stopped(tmp_path, devices):
    """Cut by max_steps in epoch 2 (and saved every 2 batches), then resumed: the unbroken
    run, bit for bit, its step count carried over (the epochs have no one length)."""
    stream = functools.partial(Samples, noise=0.1, shuffled=True)
    whole, whole_result = train(stream(), devices, max_steps=13, log_every_n_steps=1)
    train(stream(), devices, max_steps=7, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    resumed, result = train(stream(), devices, max_steps=13, checkpoint_dir=str(tmp_path), resume=True,
                            log_every_n_steps=1)
    assert rows(result) == rows(whole_result)
    assert [r["step"] for r in result["step_history"]] == list(range(8, 14))
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)

    class Shorter(Samples):     # (the same samples, but only 40 a pass)
        def __iter__(self):
            return itertools.islice(super().__iter__(), 40)
    with pytest.raises(ValueError, match=r"Shorter yielded 40 samples in pass 3, fewer than the 3 batches of 20 the "
                                         r"checkpoint trained of it: resume on the same stream"):
        train(Shorter(noise=0.1, shuffled=True), devices, max_steps=20, checkpoint_dir=str(tmp_path), resume=True)


def test_a_pass_of_no_sample_is_an_error():
    class Dry(Samples):
        def __iter__(self):
            return iter(()) if self.epoch == 1 else super().__iter__()
    with pytest.raises(ValueError, match="Dry yielded no sample in pass 2: a stream must yield samples every pass"):
        train(Dry())


def test_evaluate_and_predict_read_a_stream_without_a_length_to_its_end():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 3))
    want = dptrain.evaluate(model, (X, Y), batch_size=32)
    assert dptrain.evaluate(model, Samples(), batch_size=32, devices=2) == pytest.approx(want)
    torch.testing.assert_close(dptrain.predict(model, Samples(), batch_size=32, devices=2), model(X))


def test_sharded_stream_is_for_a_training_stream_and_one_process_reads_it_whole():
    """(Its processes' shares: ``tests/distributed/test_fit_dist.py``.)"""
    with pytest.raises(ValueError, match="sharded_stream applies to a training stream"):
        train((X, Y), sharded_stream=True)
    want_model, want = train(SizedSamples(), dropout=0)
    model, result = train(SizedSamples(), dropout=0, sharded_stream=True)
    assert rows(result) == rows(want)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), want_model.parameters()))


def test_evaluate_and_predict_take_one_way_to_read_a_stream():
    model = nn.Sequential(nn.Linear(8, 3))
    for call in (dptrain.evaluate, dptrain.predict):
        with pytest.raises(ValueError, match="say two ways to read a stream: give one"):
            call(model, SizedSamples(), dispatch_batches=True, sharded_stream=True)
        assert call(model, SizedSamples(), dispatch_batches=True) is not None      # one process: read as usual
