"""A stream that yields whole batches, ``DataLoader(stream, batch_size=None)`` (WebDataset's
``.batched(n)``, a generator of batches): each batch one global batch, of any size, so N
devices take the plain loop's steps over that DataLoader; resumed mid-epoch, with
``steps_per_epoch``, with workers, and in ``evaluate`` and ``predict`` (it was an error
saying to make the stream yield samples)."""
import functools
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import dptrain
from tests.run.test_streams import X, Y

SIZES = [7, 13, 10, 5, 12, 3, 20, 20]       # 90 rows, in batches of these sizes


class Batches(IterableDataset):
    """Consecutive rows of X, Y in batches of ``SIZES`` (in an order set by ``set_epoch``),
    ``noise * torch.randn`` added as they are read; each worker yields every other batch."""

    def __init__(self, noise=0.0, shuffled=False, sized=False):
        self.noise, self.shuffled, self.sized, self.epoch = noise, shuffled, sized, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        if not self.sized:
            raise TypeError("no length")
        return len(SIZES)

    def __iter__(self):
        starts = [sum(SIZES[:i]) for i in range(len(SIZES))]
        order = list(range(len(SIZES)))
        if self.shuffled:
            order = torch.randperm(len(SIZES), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        worker = get_worker_info()
        for i in order if worker is None else order[worker.id::worker.num_workers]:
            rows = slice(starts[i], starts[i] + SIZES[i])
            yield {"x": X[rows] + self.noise * torch.randn(SIZES[i], 8), "y": Y[rows]}


def model_():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = model_()

    def forward(self, x):
        return self.body(x)


def train(data, devices=1, **kw):
    model = Net()
    kw.setdefault("epochs", 3)
    result = dptrain.fit(model, data, kw.pop("eval_data", None), devices=devices, log=None, progress=False,
                         optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
                         **{"shuffle": False, **kw})
    return model, result


def plain_loop(loader, epochs=3, steps=None):
    """The plain loop over the DataLoader: a step per batch (``steps``: that many a pass, on)."""
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1234)
    for epoch in range(epochs):
        loader.dataset.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(batch["x"]), batch["y"]).backward()
            optimizer.step()
    return model


def close(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_each_batch_of_the_stream_is_a_step_as_in_the_plain_loop(devices):
    want = plain_loop(DataLoader(Batches(shuffled=True), batch_size=None))
    model, result = train(DataLoader(Batches(shuffled=True), batch_size=None), devices,
                          eval_data=DataLoader(Batches(), batch_size=None))
    close(model, want)
    assert [(r["batches"], r["samples"]) for r in result["history"]] == [(8, 90)] * 3
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(X), Y).item()
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5)
    sized, _ = train(DataLoader(Batches(shuffled=True, sized=True), batch_size=None), devices)
    close(sized, want)
    figures = dptrain.evaluate(model, DataLoader(Batches(), batch_size=None), devices=devices)
    assert figures["test_loss"] == pytest.approx(loss, rel=1e-5)
    out = dptrain.predict(model, DataLoader(Batches(), batch_size=None), devices=devices)
    torch.testing.assert_close(out, model(X).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_run_stopped_mid_epoch_resumes_at_its_batch(tmp_path, devices):
    stream = functools.partial(Batches, noise=0.1, shuffled=True)
    whole, whole_result = train(DataLoader(stream(), batch_size=None), devices, max_steps=13)
    train(DataLoader(stream(), batch_size=None), devices, max_steps=7, checkpoint_dir=str(tmp_path),
          checkpoint_every=2)
    resumed, result = train(DataLoader(stream(), batch_size=None), devices, max_steps=13,
                            checkpoint_dir=str(tmp_path), resume=True)
    assert [r["train_loss"] for r in result["history"]] == [r["train_loss"] for r in whole_result["history"]]
    assert all(torch.equal(p, q) for p, q in zip(whole.parameters(), resumed.parameters()))


def test_steps_per_epoch_runs_on_over_the_passes_and_workers_are_taken_in_turn():
    # 5 batches an epoch, 3 epochs: 15 batches, the stream's passes of 8 run on (pass 2 from its batch 3)
    model, result = train(DataLoader(Batches(), batch_size=None), 2, steps_per_epoch=5)
    want = Net()
    optimizer = torch.optim.SGD(want.parameters(), lr=0.1, momentum=0.9)
    batches = [b for _ in range(2) for b in DataLoader(Batches(), batch_size=None)][:15]
    for batch in batches:
        optimizer.zero_grad()
        nn.functional.cross_entropy(want(batch["x"]), batch["y"]).backward()
        optimizer.step()
    close(model, want)
    assert [r["samples"] for r in result["history"]] == [
        sum(SIZES[:5]), sum(SIZES[5:]) + sum(SIZES[:2]), sum(SIZES[2:7])]
    workers, _ = train(DataLoader(Batches(), batch_size=None, num_workers=2), 2)
    close(workers, plain_loop(DataLoader(Batches(), batch_size=None, num_workers=2)))


def test_what_a_batching_stream_cannot_do_is_said():
    with pytest.raises(ValueError, match=r"drop_last drops a short last batch.*Batches makes the batches"):
        train(DataLoader(Batches(), batch_size=None), drop_last=True)
    lines = []
    dptrain.fit(Net(), DataLoader(Batches(), batch_size=None), epochs=1, batch_size=32, log=lines.append,
                progress=False)
    assert any("batch_size=32 is not used: the DataLoader's dataset Batches makes the batches" in line
               for line in lines), lines

    class Longer(Batches):
        def __len__(self):
            return 3
    with pytest.raises(ValueError, match=r"Longer yielded more batches in pass 1 than its __len__ \(3\)"):
        train(DataLoader(Longer(), batch_size=None))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes: Python >= 3.11")
def test_a_stream_of_batches_given_as_it_is_has_its_failure_say_how_to_give_it():
    """Given without DataLoader(batch_size=None), its batches are read as samples and stacked:
    the error (here stacking batches of 7 and 13 rows) says so, with the fix; a stream of samples'
    errors do not (the error alone was "stack expects each tensor to be equal size")."""
    with pytest.raises(RuntimeError) as failed:
        train(Batches(), batch_size=2)
    assert any("each item Batches yields is read as one sample, 2 of them stacked to a batch (its first item holds "
               "tensors of shapes (7, 8), (7,)); if it yields whole batches, give DataLoader(Batches(...), "
               "batch_size=None)" in note for note in failed.value.__notes__), failed.value.__notes__

    class Samples(IterableDataset):
        def __iter__(self):
            for x, y in zip(X, Y):
                yield x[:7], y        # (the model takes 8 features)
    with pytest.raises(RuntimeError) as failed:
        train(Samples())
    assert not any("yields is read as one sample" in note for note in getattr(failed.value, "__notes__", []))


def test_a_generator_is_an_error_giving_the_stream_that_makes_it_which_trains():
    """Keras's fit(generator, steps_per_epoch=N): an iterator cannot be read again each epoch
    (it was "a batch must hold at least one tensor, got generator"); the error's fix runs as written."""
    def make_batches():
        while True:
            x = torch.randn(16, 8)
            yield {"x": x, "y": (x[:, 0] > 0).long()}
    with pytest.raises(TypeError, match=r"the data is a generator .*class Batches\(IterableDataset\): def __iter__"
                                        r"\(self\): return make_batches\(\); fit\(model, DataLoader\(Batches\(\), "
                                        r"batch_size=None\), steps_per_epoch=N\)"):
        dptrain.fit(Net(), make_batches(), epochs=1, log=None)

    class Batches(IterableDataset):
        def __iter__(self):
            return make_batches()
    results = [train(DataLoader(Batches(), batch_size=None), devices, steps_per_epoch=4, epochs=2)[1]
               for devices in (1, 2)]
    assert [(r["batches"], r["samples"]) for r in results[0]["history"]] == [(4, 64)] * 2
    assert [r["train_loss"] for r in results[1]["history"]] == pytest.approx(
        [r["train_loss"] for r in results[0]["history"]], rel=1e-5)        # the same draws on 1 and 2 devices


class Stored(torch.utils.data.Dataset):
    """A map-style dataset of whole batches (one per file in a store): item i is batch i."""

    def __len__(self):
        return len(SIZES)

    def __getitem__(self, i):
        start = sum(SIZES[:i])
        return {"x": X[start:start + SIZES[i]], "y": Y[start:start + SIZES[i]]}


@pytest.mark.parametrize("devices", [1, 2])
def test_a_map_style_dataset_of_whole_batches_trains_a_step_per_item(devices):
    """``DataLoader(dataset, batch_size=None)`` over a map-style dataset of batches (it failed:
    "CrossEntropyLoss needs tensor targets, got list"): in order, the plain loop's steps; shuffled
    (fit's default), each batch once an epoch in an order of (seed, epoch), the same on any devices
    and workers; a sampler's pick of them, as drawn."""
    model, _ = train(DataLoader(Stored(), batch_size=None), devices)
    close(model, plain_loop(DataLoader(Batches(), batch_size=None)))       # (the same batches, in order)
    shuffled = [train(DataLoader(Stored(), batch_size=None, num_workers=w), d, shuffle=True)
                for d, w in ((1, 0), (devices, 2))]
    close(shuffled[0][0], shuffled[1][0])
    assert [(r["batches"], r["samples"]) for r in shuffled[1][1]["history"]] == [(8, 90)] * 3
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(shuffled[0][0].parameters(), model.parameters()))
    picked = train(DataLoader(Stored(), batch_size=None, sampler=[1, 3]), devices)[1]      # (a list: its order)
    assert [(r["batches"], r["samples"]) for r in picked["history"]] == [(2, SIZES[1] + SIZES[3])] * 3
