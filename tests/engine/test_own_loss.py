"""A Hugging Face-style model that computes its own loss from the batch's ``labels``: a causal
LM's (logits at t against the label at t + 1) trains on it, as the plain loop on the model's
own loss, on 1 and 2 devices and 2 processes (it trained on the labels in place, learning to
copy its input); its accuracy and evaluation read the next token; a model whose loss is
another one is an error naming ``step=`` and ``loss=``."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.own_loss import next_token, takes_labels
from tests.distributed.helpers import run_workers


class CausalLM(nn.Module):
    """Each position sees the tokens up to it (a running mean); its own loss is a causal LM's."""

    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Embedding(16, dim)
        self.mix, self.head = nn.Linear(dim, dim), nn.Linear(dim, vocab)

    def logits(self, input_ids):
        t = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = (self.emb(input_ids) + self.pos(t)).cumsum(1) / (t + 1).to(self.pos.weight.dtype)[:, None]
        return self.head(torch.tanh(self.mix(h)))

    def own_loss(self, logits, labels):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.logits(input_ids)
        return {"loss": None if labels is None else self.own_loss(logits, labels), "logits": logits}


class SmoothedLM(CausalLM):
    """Its own loss is not cross-entropy of its logits: label smoothing."""

    def own_loss(self, logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), label_smoothing=0.1)


class TokenTagger(CausalLM):
    """A token classifier: position t's logits against position t's label, as dptrain reads them."""

    def own_loss(self, logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def sequences(n=24):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 11, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)}
            for _ in range(n)]


def collate(items):
    longest = max(len(s["input_ids"]) for s in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(items):
        ids[i, :len(s["input_ids"])], mask[i, :len(s["input_ids"])] = s["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def made(kind=CausalLM):
    torch.manual_seed(0)
    return kind().double()


def train(devices=1, kind=CausalLM, lr=0.5, **kw):
    model = made(kind)
    result = dptrain.fit(model, sequences(), sequences(), collate_fn=collate, epochs=2, batch_size=8, lr=lr,
                         optimizer=torch.optim.SGD, devices=devices, shuffle=False, **{"log": None, **kw})
    return model, result


def plain_loop(kind=CausalLM, lr=0.5):
    model = made(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data = sequences()
    for _ in range(2):
        for start in range(0, len(data), 8):
            optimizer.zero_grad()
            model(**collate(data[start:start + 8]))["loss"].backward()
            optimizer.step()
    return model


def close(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)


def test_next_token_shifts_the_labels_and_ignores_the_last_position():
    labels = torch.tensor([[5, 6, 7, -100], [1, 2, 3, 4]])
    assert next_token(labels).tolist() == [[6, 7, -100, -100], [2, 3, 4, -100]]
    assert takes_labels(CausalLM()) and not takes_labels(nn.Linear(2, 2))


@pytest.mark.parametrize("devices", [1, 2])
def test_a_causal_lm_trains_on_its_own_loss_as_the_plain_loop(devices):
    lines = []
    model, result = train(devices, log=lines.append)
    close(model, plain_loop())
    assert any("CausalLM computes its loss on the next token" in line for line in lines)
    # The evaluation's loss is the model's own over every labelled token of the set.
    with torch.no_grad():
        batch = collate(sequences())
        logits = model(**batch)["logits"]
        want = F.cross_entropy(logits[:, :-1].reshape(-1, 11), batch["labels"][:, 1:].reshape(-1))
    assert result["history"][-1]["test_loss"] == pytest.approx(want.item(), rel=1e-9)


def test_its_accuracy_is_the_next_tokens_in_training_and_evaluation():
    # lr 0: the model stays as it is, so the epoch's training accuracy is the set's
    model, result = train(2, lr=0.0, train_metrics=True)
    with torch.no_grad():
        batch = collate(sequences())
        guesses, labels = model(**batch)["logits"].argmax(-1)[:, :-1], batch["labels"][:, 1:]
    kept = labels != -100
    want = ((guesses == labels) & kept).sum().item() / kept.sum().item()
    row = result["history"][-1]
    assert row["train_acc"] == pytest.approx(want) and row["test_acc"] == pytest.approx(want)


def test_a_token_classifier_is_read_in_place_and_its_training_accuracy_counts_tokens():
    lines = []
    model, result = train(2, kind=TokenTagger, lr=0.0, train_metrics=True, log=lines.append)
    assert not any("next token" in line for line in lines)
    with torch.no_grad():
        batch = collate(sequences())
        guesses = model(**batch)["logits"].argmax(-1)     # (classes last: it compared dimension 1, the tokens)
    kept = batch["labels"] != -100
    want = ((guesses == batch["labels"]) & kept).sum().item() / kept.sum().item()
    assert result["history"][-1]["train_acc"] == pytest.approx(want)
    assert result["history"][-1]["test_acc"] == pytest.approx(want)


def test_a_model_whose_own_loss_is_another_one_is_an_error_naming_step_and_loss():
    with pytest.raises(ValueError, match=r"SmoothedLM's own loss on one labelled token of the first sample is .*, but "
                                         r"cross-entropy of its logits .* Pass step=lambda model, batch: "
                                         r"model\(\*\*batch\) to train on the model's own loss"):
        train(kind=SmoothedLM)
    # what it says works: the model's own loss, as the plain loop's
    model, _ = train(kind=SmoothedLM, step=lambda model, batch: model(**batch))
    close(model, plain_loop(SmoothedLM))


class SummedLM(CausalLM):
    """A causal LM whose own loss sums its tokens' (reduction="sum"): the same as the mean on one token."""

    def own_loss(self, logits, labels):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               reduction="sum")


class SummedTagger(TokenTagger):
    def own_loss(self, logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")


class LastTokenLM(CausalLM):
    """Its own loss weighs the last labelled token alone: right on any one token, wrong on two."""

    def own_loss(self, logits, labels):
        shifted = labels[:, 1:]
        last = (shifted != -100).long().cumsum(1).argmax(1)       # (each row's last labelled position)
        rows = torch.arange(len(labels))
        return F.cross_entropy(logits[rows, last], shifted[rows, last])


@pytest.mark.parametrize("kind", [SummedLM, SummedTagger])
def test_a_model_whose_own_loss_sums_its_tokens_is_an_error_saying_so(kind):
    # One token's loss is the same summed or averaged: two tell them apart.
    with pytest.raises(ValueError, match=rf"{kind.__name__}'s own loss on two labelled tokens of the first sample "
                                         r"is .*, their mean: its loss is their sum \(reduction='sum'\), at another "
                                         r"scale\. Pass step=lambda model, batch: model\(\*\*batch\)"):
        train(kind=kind)
    model, _ = train(kind=kind, lr=0.01, step=lambda model, batch: model(**batch))
    close(model, plain_loop(kind, lr=0.01))


def test_a_model_whose_own_loss_is_right_on_one_token_only_is_an_error():
    with pytest.raises(ValueError, match=r"LastTokenLM's own loss on two labelled tokens of the first sample is .*, "
                                         r"their mean: its loss is another one \(label smoothing"):
        train(kind=LastTokenLM)


def two_processes(rank, world):
    model, result = train()
    return [p.detach().tolist() for p in model.parameters()], result["history"][-1]["test_loss"]


def test_two_processes_train_a_causal_lm_as_one_device():
    want, (_, result) = plain_loop(), train()
    for params, test_loss in run_workers(two_processes):
        for p, q in zip(params, want.parameters()):
            torch.testing.assert_close(torch.tensor(p, dtype=torch.float64), q.detach(), rtol=1e-9, atol=1e-12)
        assert test_loss == pytest.approx(result["history"][-1]["test_loss"], rel=1e-9)


class Regressor(nn.Module):
    """A Hugging Face sequence classifier with num_labels=1: its own loss is MSE of its (N, 1) logits."""

    def __init__(self, smoothing=None):
        super().__init__()
        self.f, self.smoothing = nn.Linear(4, 1 if smoothing is None else 3), smoothing

    def forward(self, x, labels=None):
        logits = self.f(x)
        if labels is None:
            return {"logits": logits}
        if self.smoothing is None:
            return {"loss": F.mse_loss(logits.squeeze(-1), labels), "logits": logits}
        return {"loss": F.cross_entropy(logits, labels, label_smoothing=self.smoothing), "logits": logits}


def rows(n=20, classes=False):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = X[:, :3].argmax(1) if classes else X.sum(1)
    return [{"x": X[i], "labels": y[i]} for i in range(n)]


@pytest.mark.parametrize("devices", [1, 2])
def test_labels_cross_entropy_cannot_take_train_on_the_models_own_loss(devices):
    torch.manual_seed(0)
    model, want = Regressor().double(), Regressor().double()
    want.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(want.parameters(), lr=0.1)
    data = rows()
    for start in range(0, 20, 8):
        optimizer.zero_grad()
        want(torch.stack([r["x"] for r in data[start:start + 8]]),
             torch.stack([r["labels"] for r in data[start:start + 8]]))["loss"].backward()
        optimizer.step()
    lines = []
    result = dptrain.fit(model, data, data, epochs=1, batch_size=8, lr=0.1, optimizer=torch.optim.SGD,
                         devices=devices, shuffle=False, log=lines.append)
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)
    assert any("Regressor computes its own loss from the labels, and cross-entropy, dptrain's default, cannot take "
               "its float labels" in line for line in lines)
    batch = {k: torch.stack([r[k] for r in data]) for k in ("x", "labels")}
    with torch.no_grad():
        assert result["history"][-1]["test_loss"] == pytest.approx(model(**batch)["loss"].item(), rel=1e-9)


def test_a_classifier_whose_own_loss_is_another_one_is_an_error():
    with pytest.raises(ValueError, match=r"Regressor's own loss on the first sample is .*, but cross-entropy of its "
                                         r"logits .* Pass step=lambda model, batch: model\(\*\*batch\)"):
        dptrain.fit(Regressor(smoothing=0.2).double(), rows(classes=True), None, epochs=1, batch_size=8, devices=1,
                    log=None)


class Answerer(nn.Module):
    """A question-answering model: its own loss reads start and end positions, not labels."""

    def __init__(self):
        super().__init__()
        self.f = nn.Linear(4, 2)

    def forward(self, x, start_positions=None, end_positions=None):
        start, end = self.f(x).unbind(-1)       # (N, T) each
        if start_positions is None:
            return {"start_logits": start, "end_logits": end}
        loss = (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2
        return {"loss": loss, "start_logits": start, "end_logits": end}


@pytest.mark.parametrize("devices", [1, 2])
def test_a_batch_with_no_target_trains_on_the_models_own_loss(devices):
    g = torch.Generator().manual_seed(2)
    X = torch.randn(20, 6, 4, generator=g, dtype=torch.float64)
    data = [{"x": X[i], "start_positions": X[i, :, 0].argmax(), "end_positions": X[i, :, 1].argmax()}
            for i in range(20)]
    torch.manual_seed(0)
    model, want = Answerer().double(), Answerer().double()
    want.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(want.parameters(), lr=0.1)
    for start in range(0, 20, 8):
        optimizer.zero_grad()
        want(**{k: torch.stack([r[k] for r in data[start:start + 8]]) for k in data[0]})["loss"].backward()
        optimizer.step()
    lines = []
    dptrain.fit(model, data, None, epochs=1, batch_size=8, lr=0.1, optimizer=torch.optim.SGD, devices=devices,
                shuffle=False, log=lines.append)
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)
    assert any("the batches hold no target (x, start_positions, end_positions) and Answerer computes its own loss "
               "from them" in line for line in lines)


@pytest.mark.parametrize("seed", range(4))
def test_in_16_bits_the_reading_is_told_apart_at_the_clearest_token(seed):
    for kind, shifted in ((CausalLM, True), (TokenTagger, False)):
        torch.manual_seed(seed)
        lines = []
        dptrain.fit(kind().bfloat16(), sequences(), None, collate_fn=collate, epochs=1, batch_size=8, devices=1,
                    log=lines.append)
        assert any("computes its loss on the next token" in line for line in lines) == shifted


class Picky(TokenTagger):
    """Its own loss takes one label per sample, so given token labels it fails: not dptrain's
    business, which trains on its logits against them, as before the check."""

    def own_loss(self, logits, labels):
        if labels.dim() != 1:
            raise ValueError("labels must be one per sample")
        return F.cross_entropy(logits[:, -1], labels)


def test_a_model_that_fails_when_given_the_labels_is_trained_as_before():
    model, result = train(2, kind=Picky)
    want, _ = train(2, kind=TokenTagger)
    for p, q in zip(model.parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)


def test_evaluate_alone_reads_a_causal_lm_and_a_regressor_as_fit_does():
    model = made()
    batch = collate(sequences())
    with torch.no_grad():
        want = model(**batch)["loss"].item()
    assert dptrain.evaluate(model, sequences(), collate_fn=collate, devices=2)["test_loss"] == pytest.approx(want)
    regressor = Regressor().double()
    batch = {k: torch.stack([r[k] for r in rows()]) for k in ("x", "labels")}
    with torch.no_grad():
        want = regressor(**batch)["loss"].item()
    assert dptrain.evaluate(regressor, rows(), devices=2)["test_loss"] == pytest.approx(want)
