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
    with pytest.raises(TypeError, match="predict joins the model's outputs part by part: cannot join values of type "
                                        "float sample by sample.*pass forward="):
        dptrain.predict(nn.Linear(2, 2), torch.zeros(5, 2), batch_size=4, devices=1, forward=lambda m, x: len(x) * 1.5)


@pytest.mark.parametrize("devices", [1, 2])
def test_an_output_beside_a_number_for_the_part_is_said_with_the_fix(devices):
    """A mixture of experts' ``(logits, aux_loss)`` failed in torch.cat ("zero-dimensional tensor
    cannot be concatenated"); the fix the error gives works."""
    class WithAux(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 3)

        def forward(self, x):
            return self.inner(x), self.inner.weight.sum()
    model, X = WithAux(), torch.randn(5, 2)
    with pytest.raises(TypeError, match=r"cannot join 0-dim tensors.*auxiliary loss.*lambda model, x: model\(x\)\[0\]"):
        dptrain.predict(model, X, batch_size=4, devices=devices)
    got = dptrain.predict(model, X, batch_size=4, devices=devices, forward=lambda model, x: model(x)[0])
    torch.testing.assert_close(got, model(X)[0].detach())


@pytest.mark.parametrize("devices", [1, 2])
def test_a_namedtuple_output_and_a_hugging_face_style_loss_of_none_are_joined(devices):
    """A model returning ``Out(logits, embedding)`` (a namedtuple) failed in its constructor;
    one returning ``{"loss": None, "logits": ...}`` without labels (a Hugging Face model's
    dict) failed on the None."""
    from collections import UserDict, namedtuple
    Out = namedtuple("Out", "logits embedding")

    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 3)

        def forward(self, x, labels=None):
            return Out(self.body(x), x * 2)
    torch.manual_seed(0)
    model, X = Named(), torch.randn(11, 4)
    out = dptrain.predict(model, X, batch_size=4, devices=devices)
    assert type(out) is Out and torch.equal(out.embedding, X * 2)
    torch.testing.assert_close(out.logits, model(X).logits)
    encoded = DataLoader(range(11), batch_size=4, collate_fn=lambda idx: UserDict(x=X[idx]))   # a BatchEncoding
    assert torch.equal(dptrain.predict(model, encoded, devices=devices).embedding, X * 2)
    hf = dptrain.predict(model, {"x": X}, batch_size=4, devices=devices,
                         forward=lambda m, b: {"loss": None, "logits": m(**b).logits})
    assert hf["loss"] is None and hf["logits"].shape == (11, 3)


class Cache:
    """A causal LM's key-value cache: an object of its own, not joined sample by sample."""

    def __init__(self, keys):
        self.keys = keys


class CachingLM(nn.Module):
    """A Hugging Face-style model (it has a config) whose eval-mode output holds its cache, and
    maybe other objects (mems)."""

    def __init__(self, ignored=None, mems=False):
        super().__init__()
        self.config = type("Config", (), {} if ignored is None else {"keys_to_ignore_at_inference": ignored})()
        self.f, self.mems = nn.Linear(4, 3), mems

    def forward(self, input_ids):
        out = {"logits": self.f(input_ids), "past_key_values": Cache(input_ids)}
        return {**out, "mems": Cache(input_ids)} if self.mems else out


@pytest.mark.parametrize("devices", [1, 2])
def test_a_hugging_face_models_cache_is_left_out_as_the_trainer_leaves_it(devices):
    X = torch.randn(6, 4)
    for model in (CachingLM(), CachingLM(ignored=["past_key_values", "mems"], mems=True)):
        out = dptrain.predict(model, {"input_ids": X}, devices=devices, batch_size=4)
        assert out["past_key_values"] is None and out.get("mems") is None
        with torch.no_grad():
            torch.testing.assert_close(out["logits"], model.f(X))
    # transformers 5's configs name no keys: its cache is left out, other objects are said
    with pytest.raises(TypeError, match="cannot join values of type Cache"):
        dptrain.predict(CachingLM(mems=True), {"input_ids": X}, devices=devices, batch_size=4)
