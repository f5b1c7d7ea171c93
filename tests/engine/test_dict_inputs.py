"""A dict batch meets the model by name, ``model(**batch)``, or whole, ``model(batch)``, when
the forward takes one argument and none of the keys (``def forward(self, batch)``): trained
as the plain loop trains it, on 1 and 2 devices; predicted with; a forward that takes
neither is an error naming both ways."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.dict_inputs import call_with_dict, one_argument


class ReadsTheBatch(nn.Module):
    """Research code's model: it reads the dict itself, and gives its own loss or its logits."""

    def __init__(self, own_loss):
        super().__init__()
        self.f, self.own_loss = nn.Linear(4, 3), own_loss

    def forward(self, batch):
        logits = self.f(batch["x"] * batch["scale"])
        if not self.own_loss:
            return logits
        return {"loss": nn.functional.cross_entropy(logits, batch["y"]), "logits": logits}


def samples(n=37):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 4, generator=g)
    return [{"x": X[i], "scale": torch.tensor([2.0]), "y": X[i, :3].argmax()} for i in range(n)]


@pytest.mark.parametrize("own_loss", [True, False])
@pytest.mark.parametrize("devices", [1, 2])
def test_a_forward_of_the_batch_trains_as_the_plain_loop(devices, own_loss):
    data = samples()
    torch.manual_seed(0)
    model = ReadsTheBatch(own_loss)
    plain = ReadsTheBatch(own_loss)
    plain.load_state_dict(model.state_dict())
    result = dptrain.fit(model, data, data[:10], epochs=2, batch_size=8, shuffle=False, optimizer=torch.optim.SGD,
                         lr=0.5, devices=devices, log=None, progress=False)
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.5)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    for _ in range(2):
        for batch in loader:
            optimizer.zero_grad()
            out = plain(batch)
            loss = out["loss"] if own_loss else nn.functional.cross_entropy(out, batch["y"])
            loss.backward()
            optimizer.step()
    for got, want in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert 0 <= result["test_acc"] <= 1
    out = dptrain.predict(model, data, batch_size=8, devices=devices)
    logits = out["logits"] if own_loss else out
    torch.testing.assert_close(logits, plain(next(iter(torch.utils.data.DataLoader(data, batch_size=37))))[
        "logits" if own_loss else slice(None)].detach(), rtol=1e-5, atol=1e-6)


def test_a_forward_that_takes_the_batch_neither_way_is_told_both():
    model = nn.Linear(4, 3)                 # forward(input): one argument, but a tensor's
    batch = {"image": torch.zeros(2, 4), "label": torch.zeros(2, dtype=torch.long)}
    with pytest.raises(TypeError, match=r"model\(\*\*batch\) without its target \(.*'image'\), or, to a forward of "
                                        r"one argument, whole as model\(batch\), which failed too.*forward=fn"):
        call_with_dict(model, batch, {"image": batch["image"]})

    class ByName(nn.Module):
        def forward(self, pixels, mask=None):
            return pixels
    with pytest.raises(TypeError, match=r"keys must be the arguments of ByName.forward"):
        call_with_dict(ByName(), batch, {"image": batch["image"]})
    assert one_argument(model) and not one_argument(ByName()) and not one_argument(lambda *a: a)
    assert not one_argument(model, {"input": 1, "label": 2})       # it takes that key by name
    # a forward taking its inputs by name is called so, never with the dict
    assert torch.equal(call_with_dict(ByName(), {"pixels": torch.ones(1)}, {"pixels": torch.ones(1)}), torch.ones(1))


class EncoderDecoder(nn.Module):
    """Hugging Face's T5 in small: without decoder inputs it makes them from its labels (shifted
    right, -100 as the start token 0), and without either its decoder fails."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(9, 6), nn.Linear(6, 9)

    def prepare_decoder_input_ids_from_labels(self, labels):
        return nn.functional.pad(labels[:, :-1], (1, 0), value=0).clamp(min=0)

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, labels=None):
        if decoder_input_ids is None and labels is not None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        if decoder_input_ids is None:
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        logits = self.out(torch.tanh(self.emb(input_ids).mean(1, keepdim=True) + self.emb(decoder_input_ids)))
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


def pairs(n=20):
    g = torch.Generator().manual_seed(0)
    sources = torch.randint(1, 9, (n, 5), generator=g)
    targets = sources[:, :4].flip(1)
    targets[::3, -1] = -100         # (padding)
    return [{"input_ids": s, "labels": t} for s, t in zip(sources, targets)]


@pytest.mark.parametrize("devices", [1, 2])
def test_an_encoder_decoder_gets_its_decoder_inputs_made_from_the_labels(devices):
    torch.manual_seed(0)
    model = EncoderDecoder().double()
    want = EncoderDecoder().double()
    want.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(want.parameters(), lr=0.5)
    data = pairs()
    for start in range(0, 20, 8):
        batch = {k: torch.stack([s[k] for s in data[start:start + 8]]) for k in ("input_ids", "labels")}
        optimizer.zero_grad()
        want(**batch)["loss"].backward()
        optimizer.step()
    dptrain.fit(model, data, None, epochs=1, batch_size=8, lr=0.5, optimizer=torch.optim.SGD, devices=devices,
                shuffle=False, log=None)
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)
    predicted = dptrain.predict(model, data, batch_size=8)      # teacher-forced, as the Trainer's predict
    batch = {k: torch.stack([s[k] for s in data]) for k in ("input_ids", "labels")}
    with torch.no_grad():
        torch.testing.assert_close(predicted["logits"], model(**batch)["logits"])
