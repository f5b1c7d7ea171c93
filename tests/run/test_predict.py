"""``dptrain.predict``: every sample once, in order, on any number of devices; the model's
output structure kept; targets left out; the model's mode restored."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dptrain


class Both(nn.Module):
    """Returns a dict: the Hugging Face shape, logits and a second head."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 1)

    def forward(self, features):
        return {"logits": self.a(features), "score": self.b(features)}


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_outputs_in_order_for_every_sample(devices):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    X, y = torch.randn(37, 4), torch.randint(0, 2, (37,))
    want = model.eval()(X)
    model.train()
    for data in (X, (X, y), TensorDataset(X, y), DataLoader(TensorDataset(X, y), batch_size=5)):
        out = dptrain.predict(model, data, batch_size=8, devices=devices)
        torch.testing.assert_close(out, want)            # eval mode: no dropout
    assert model.training                                # restored


def test_a_model_returning_a_dict_and_dict_batches():
    torch.manual_seed(0)
    model = Both()
    X = torch.randn(11, 4)
    out = dptrain.predict(model, {"features": X, "label": torch.zeros(11)}, batch_size=4, devices=2)
    torch.testing.assert_close(out["logits"], model(X)["logits"])
    torch.testing.assert_close(out["score"], model(X)["score"])
    custom = dptrain.predict(model, X, batch_size=4, devices=2, forward=lambda m, x: m(x)["logits"].argmax(1))
    assert torch.equal(custom, model(X)["logits"].argmax(1))


def test_what_predict_cannot_join_is_said():
    with pytest.raises(TypeError, match="predict joins tensors, tuples, lists and dicts of them; the model returned "
                                        "str"):
        dptrain.predict(nn.Linear(2, 2), torch.zeros(4, 2), devices=1, forward=lambda m, x: "no")
