"""A model in bfloat16 throughout (``model.to(torch.bfloat16)``, no autocast), on bfloat16 data:
it trains, evaluates and predicts on any devices (its data's fingerprint failed on NumPy's
missing bfloat16: a TypeError before the first batch), its parameters stay bfloat16, and its
logits are widened to float32 for the loss, as autocast's cross-entropy is."""
import copy

import torch
from torch import nn
from torch.nn import functional as F

import dptrain


def data(n=128):
    torch.manual_seed(0)
    return torch.randn(n, 8).bfloat16(), torch.randint(0, 3, (n,))


def net():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(torch.bfloat16)


def plain(model, X, y, epochs=2, batch=32, lr=0.1):
    """The plain loop, its logits widened for the loss (``F.cross_entropy(logits.float(), y)``)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for i in range(0, len(X), batch):
            opt.zero_grad()
            F.cross_entropy(model(X[i:i + batch]).float(), y[i:i + batch]).backward()
            opt.step()
    return model


def test_a_bfloat16_model_trains_as_the_plain_loop_on_one_device_and_within_a_rounding_on_more():
    X, y = data()
    expected = plain(net(), X, y)
    for devices in (1, 2, 3):
        model = net()
        result = dptrain.fit(model, (X, y), (X, y), epochs=2, batch_size=32, lr=0.1, devices=devices, log=None,
                             shuffle=False)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        diffs = [(p.float() - q.float()).abs().max().item() for p, q in zip(model.parameters(), expected.parameters())]
        if devices == 1:
            assert max(diffs) == 0.0
        else:       # each device's gradient is rounded to bfloat16 before the sum: a unit of its last place
            assert max(diffs) <= 2 ** -8
        with torch.no_grad():
            loss = F.cross_entropy(model(X).float(), y).item()
        assert abs(result["history"][-1]["test_loss"] - loss) < 1e-6


def test_a_bfloat16_model_evaluates_and_predicts_on_two_devices_as_on_one():
    X, y = data()
    model = net()
    one, two = dptrain.evaluate(model, (X, y), devices=1), dptrain.evaluate(model, (X, y), devices=2)
    assert abs(one["test_loss"] - two["test_loss"]) < 1e-6 and one["test_acc"] == two["test_acc"]
    with torch.no_grad():
        assert abs(one["test_loss"] - F.cross_entropy(model(X).float(), y).item()) < 1e-6
        out = dptrain.predict(model, X, devices=2)
        assert out.dtype == torch.bfloat16 and torch.equal(out, model(X))


def test_a_whole_set_metric_giving_bfloat16_tensors_gives_numbers():
    X, y = data()
    metric = dptrain.whole_set(lambda predictions, labels: {"one": torch.tensor(1.5, dtype=torch.bfloat16),
                                                          "two": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)})
    figures = dptrain.evaluate(copy.deepcopy(net()), (X, y), devices=1, metrics={"w": metric})
    assert figures["test_w_one"] == 1.5 and figures["test_w_two"] == [1.0, 2.0]
