"""``loss=dptrain.whole_batch(fn)``: a loss coupling a batch's samples (in-batch negatives)
trains on N devices as on one device on the whole batch, and without it, on several devices,
such a loss is an error naming the fix."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.whole_batch import WholeBatch


def info_nce(output, target):
    """CLIP's symmetric loss: each pair's two views against every other sample of the batch."""
    za, zb = (F.normalize(z, dim=1) for z in output)
    logits = za @ zb.T / 0.1
    labels = torch.arange(len(za), device=za.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def supervised_contrastive(output, target):
    """A loss reading the targets of the whole batch: pulls same-label samples together."""
    z = F.normalize(output, dim=1)
    same = (target[:, None] == target[None, :]).float() - torch.eye(len(z))
    log_p = (z @ z.T / 0.5 - 1e9 * torch.eye(len(z))).log_softmax(dim=1)
    return -(same * log_p).sum() / same.sum().clamp(min=1)


def pairs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 6, generator=g)
    return {"a": a, "b": a + 0.3 * torch.randn(n, 6, generator=g), "i": torch.arange(n)}


def two_views(model, batch):
    return (model(batch["a"]), model(batch["b"])), None


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8))


def train(devices, loss=info_nce, n=37, batch_size=12, forward=two_views, data=None, **kw):
    """37 samples in batches of 12: a last batch of 1, fewer samples than devices."""
    model = net()
    result = dptrain.fit(model, data or pairs(n), eval_data=pairs(11, seed=1) if data is None else None,
                         loss=dptrain.whole_batch(loss), forward=forward, optimizer="sgd", lr=0.5, epochs=2,
                         batch_size=batch_size, devices=devices, log=None, shuffle=False, **kw)
    return model, result["history"]


def plain_loop(loss=info_nce, n=37, batch_size=12, epochs=2):
    model, data = net(), pairs(n)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(epochs):
        for start in range(0, n, batch_size):
            batch = {k: v[start:start + batch_size] for k, v in data.items()}
            opt.zero_grad()
            loss(*two_views(model, batch)).backward()
            opt.step()
    return model


def assert_same(model, want, history=None, want_history=None):
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for row, want_row in zip(history or [], want_history or []):
        for key in ("train_loss", "test_loss"):
            assert row[key] == pytest.approx(want_row[key], rel=1e-5), (key, row, want_row)


def test_one_device_trains_as_the_plain_loop():
    model, _ = train(1)
    assert_same(model, plain_loop())


@pytest.mark.parametrize("devices", [2, 3])
def test_several_devices_train_as_one_device_on_the_whole_batch(devices):
    want, want_history = train(1)
    model, history = train(devices)         # (the last batch: one sample, devices left idle)
    assert_same(model, want, history, want_history)


def labelled(devices, **kw):
    """The supervised contrastive loss on 40 labelled samples in batches of 10 (integer
    targets of the whole batch, beside float outputs)."""
    g = torch.Generator().manual_seed(3)
    data = (torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
    model = net()
    dptrain.fit(model, data, eval_data=None, loss=dptrain.whole_batch(supervised_contrastive), optimizer="sgd",
                lr=0.5, epochs=2, batch_size=10, devices=devices, log=None, shuffle=False, **kw)
    return model


def test_uneven_parts_accumulation_and_targets_of_the_whole_batch():
    run = labelled
    want = run(1)
    assert_same(run(3), want)                             # parts of 4, 3, 3
    assert_same(run(2, balance=[0.7, 0.3]), want)         # parts of 7 and 3
    accumulated = run(1, accumulate_grad_batches=2)       # the loss of each micro-batch, on 1 and 2 devices
    assert any((p - q).abs().max() > 1e-4 for p, q in zip(accumulated.parameters(), want.parameters()))
    assert_same(run(2, accumulate_grad_batches=2), accumulated)


def test_a_model_drawing_random_numbers_trains_on_several_devices():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net()

        def forward(self, x):
            return self.net(x + 0.01 * torch.randn_like(x))     # a draw outside the random layers
    model = Noisy()
    result = dptrain.fit(model, pairs(24), eval_data=None, loss=dptrain.whole_batch(info_nce), forward=two_views,
                         optimizer="sgd", lr=0.5, epochs=1, batch_size=12, devices=2, log=None)
    assert result["history"][-1]["train_loss"] > 0


def test_a_coupled_loss_on_several_devices_is_an_error_naming_whole_batch():
    with pytest.raises(ValueError, match=r"couples the samples of a batch.*loss=dptrain.whole_batch\(info_nce\)"):
        dptrain.fit(net(), pairs(24), eval_data=None, loss=info_nce, forward=two_views, optimizer="sgd",
                    epochs=1, batch_size=12, devices=2, log=None)
    # one device: the loss is the plain loop's; a declared reduction: each part on its own, as DDP
    for devices, reduction in ((1, None), (2, "mean")):
        dptrain.fit(net(), pairs(24), eval_data=None, loss=info_nce, forward=two_views, optimizer="sgd",
                    epochs=1, batch_size=12, devices=devices, reduction=reduction, log=None)


def test_whole_batch_is_the_loss_alone_and_refuses_what_is_not_one():
    out = (torch.randn(4, 3), torch.randn(4, 3))
    wrapped = dptrain.whole_batch(info_nce)
    assert isinstance(wrapped, WholeBatch) and wrapped.__name__ == "info_nce"
    assert torch.equal(wrapped(out, None), info_nce(out, None))
    assert dptrain.whole_batch(wrapped).fn is info_nce
    with pytest.raises(TypeError, match="whole_batch takes a loss"):
        dptrain.whole_batch(3)
    with pytest.raises(ValueError, match="not one number"):
        dptrain.fit(net(), pairs(8), eval_data=None, loss=dptrain.whole_batch(lambda o, t: o[0] - o[1]),
                    forward=two_views, optimizer="sgd", epochs=1, batch_size=8, devices=2, log=None)


def test_the_users_loss_object_is_left_as_given():
    model = net()
    wrapped = dptrain.whole_batch(info_nce)
    before = copy.copy(wrapped.__dict__)
    dptrain.fit(model, pairs(12), eval_data=None, loss=wrapped, forward=two_views, optimizer="sgd", epochs=1,
                batch_size=12, devices=2, log=None)
    assert wrapped.__dict__ == before


def test_evaluate_scores_each_batch_whole_on_any_device_count():
    """23 pairs in batches of 8: each batch's loss, weighted by its samples, on 1-3 devices."""
    model, data = net(), pairs(23)
    with torch.no_grad():
        want = sum(info_nce(two_views(model, {k: v[i:i + 8] for k, v in data.items()})[0], None).item()
                   * min(8, 23 - i) for i in range(0, 23, 8)) / 23
    for devices in (1, 2, 3):
        figures = dptrain.evaluate(model, data, loss=dptrain.whole_batch(info_nce), forward=two_views, batch_size=8,
                                   devices=devices)
        assert figures["test_loss"] == pytest.approx(want, rel=1e-6)


def test_a_device_failing_before_the_exchange_raises_its_own_error():
    """The others stop waiting for its part at once (not after the exchange's timeout, with
    a timeout's error instead of the user's)."""
    def failing(model, batch):
        if int(batch["i"][0]) == 6:             # the second device's part of the first batch
            raise KeyError("the user's own bug")
        return two_views(model, batch)
    with pytest.raises(KeyError, match="the user's own bug"):
        dptrain.fit(net(), pairs(12), eval_data=None, loss=dptrain.whole_batch(info_nce), forward=failing,
                    optimizer="sgd", epochs=1, batch_size=12, devices=2, log=None, shuffle=False)
    with pytest.raises(KeyError, match="the user's own bug"):
        dptrain.evaluate(net(), pairs(12), loss=dptrain.whole_batch(info_nce), forward=failing, batch_size=12,
                         devices=2)
