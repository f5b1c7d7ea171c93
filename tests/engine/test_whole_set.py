"""``whole_set(fn)``: a function of every output and target at once (scikit-learn's way, a
Hugging Face ``compute_metrics``) gives on any number of devices what it gives over the whole
set on one device; on two processes: ``tests/distributed/test_fit_dist.py``."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.whole_set import WholeSet


def sets():
    g = torch.Generator().manual_seed(1)
    return ((torch.randn(300, 8, generator=g), torch.randint(0, 3, (300,), generator=g)),
            (torch.randn(101, 8, generator=g), torch.randint(0, 3, (101,), generator=g)))


def auc(scores, positive):
    """Class 0 against the rest, by ranks: the share of (positive, negative) pairs in order."""
    pos, neg = scores[positive], scores[~positive]
    return ((pos[:, None] > neg[None, :]).double().mean() + 0.5 * (pos[:, None] == neg[None, :]).double().mean()).item()


def figures(out, y):
    return {"n": len(y), "auc": auc(out[:, 0], y == 0), "labels": y.tolist()}


def compute_metrics(eval_pred):
    """As a Trainer's: NumPy arrays, unpacked; the predictions are the logits."""
    predictions, labels = eval_pred
    assert isinstance(predictions, np.ndarray) and eval_pred.label_ids is labels
    right = np.argmax(predictions, axis=-1) == labels
    return {"accuracy": right.mean(), "errors": int((~right).sum())}


def trained(devices, metrics, epochs=2):
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    train, test = sets()
    result = dptrain.fit(model, train, test, epochs=epochs, batch_size=8, devices=devices, metrics=metrics,
                         log=None)
    with torch.no_grad():
        out = model(test[0])
    return result, out, test[1]


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_function_of_the_whole_set_equals_it_on_one_device(devices):
    """101 samples in batches of 8 (the last one of 5): every sample once, each output beside its
    target; on one device in the data's order."""
    result, out, y = trained(devices, {"seen": dptrain.whole_set(figures)})
    want = figures(out, y)
    assert result["test_seen_n"] == 101 and result["test_seen_auc"] == pytest.approx(want["auc"], abs=1e-12)
    assert sorted(result["test_seen_labels"]) == sorted(want["labels"])
    if devices == 1:
        assert result["test_seen_labels"] == want["labels"]
    assert [set(r) >= {"test_seen_n", "test_seen_auc"} for r in result["history"]] == [True, True]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_trainers_compute_metrics_alone_names_the_figures_and_evaluate_gives_them_too(devices):
    result, out, y = trained(devices, dptrain.whole_set(compute_metrics))
    errors = int((out.argmax(1) != y).sum())
    assert result["test_errors"] == errors and result["test_accuracy"] == pytest.approx(1 - errors / 101)
    assert result["test_accuracy"] == pytest.approx(result["test_acc"])         # dptrain's own, summed
    assert result["history"]["eval_accuracy"] == [r["test_accuracy"] for r in result["history"]]   # its name
    model = nn.Linear(8, 3)
    model.load_state_dict(dict(zip(("weight", "bias"), (torch.zeros(3, 8), torch.tensor([0.0, 0.0, 1.0])))))
    figures_of = dptrain.evaluate(model, sets()[1], metrics=dptrain.whole_set(compute_metrics), devices=devices)
    assert figures_of["test_errors"] == int((sets()[1][1] != 2).sum())


def test_a_function_given_alone_is_named_by_itself_and_a_number_by_its_key():
    def agreement(out, y):
        return (out.argmax(1) == y).double().mean()
    result, out, y = trained(2, dptrain.whole_set(agreement), epochs=1)
    assert result["test_agreement"] == pytest.approx((out.argmax(1) == y).double().mean().item())
    result, _, _ = trained(1, {"share": dptrain.whole_set(lambda out, y: np.float32(0.5))}, epochs=1)
    assert result["test_share"] == 0.5 and isinstance(result["test_share"], float)


def test_a_figure_named_as_one_of_dptrains_own_is_an_error_not_a_figure_replaced():
    with pytest.raises(ValueError, match="figure named 'loss', which would replace dptrain's own test_loss: name "
                                         "it otherwise .*'my_loss'"):
        trained(1, dptrain.whole_set(lambda eval_pred: {"loss": 0.0}), epochs=1)


def test_on_the_training_batches_it_is_over_the_epochs_samples():
    """train_metrics=True: train_<name> over every training sample of the epoch."""
    torch.manual_seed(0)
    train, _ = sets()
    result = dptrain.fit(nn.Linear(8, 3), train, epochs=1, batch_size=32, devices=2, train_metrics=True,
                         metrics={"n": dptrain.whole_set(lambda out, y: len(y))}, log=None)
    assert result["history"][0]["train_n"] == 300


def test_what_it_takes_and_gives_is_checked_with_the_fix():
    ws = WholeSet(lambda out, y: {"m": object()})
    with pytest.raises(TypeError, match=r"takes tensors, got a dict output: let a step .* return \{'loss': ..., "
                                         r"'logits': ...\}, or give fit forward=fn\(model, batch\)"):
        ws.update({"logits": torch.zeros(2, 3)}, torch.zeros(2))
    ws.update(torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(TypeError, match="'m' gave a object: return a number, or a dict of numbers"):
        ws.compute()
    with pytest.raises(TypeError, match="whole_set takes a function"):
        dptrain.whole_set("auc")
    with pytest.raises(TypeError, match="whole_set takes preprocess=fn"):
        dptrain.whole_set(len, preprocess=3)
    with pytest.raises(TypeError, match=r"preprocess returned a list: return a tensor"):
        WholeSet(len, preprocess=lambda out, y: out.tolist()).update(torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="saw no sample"):
        WholeSet(len).compute()


def test_half_precision_outputs_reach_a_numpy_function_as_float32_and_copies_share_the_function():
    seen = []
    ws = WholeSet(lambda eval_pred: seen.append(eval_pred.predictions.dtype) or 1.0)
    ws.update(torch.ones(2, 3, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.long))
    other = copy.deepcopy(ws)           # (a copy per device: the states apart, the function the same)
    other.update(torch.ones(1, 3, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.long))
    assert other.fn is ws.fn and len(ws.outputs) == 1 and len(other.outputs) == 2
    ws.merge_state(other)
    ws.merge_state({k: list(v) for k, v in other.metric_state.items()})      # (a checkpoint's state)
    assert ws.compute() == 1.0 and seen == [np.float32] and sum(len(t) for t in ws.targets) == 2 + 3 + 3


class Tagger(nn.Module):
    """A Hugging Face-style token classifier: (N, T) tokens -> (N, T, 3) logits, one per token,
    and their loss given the labels."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(20, 8), nn.Linear(8, 3)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = None if labels is None else nn.functional.cross_entropy(logits.movedim(-1, 1), labels)
        return {"loss": loss, "logits": logits}


def sentences():
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(2, 12, (45,), generator=g).tolist()
    return [(torch.randint(1, 20, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)) for n in lengths]


def pad_batch(items):
    """Each batch padded to its own longest sentence; padded labels -100 (ignored)."""
    longest = max(len(x) for x, _ in items)
    ids = torch.zeros(len(items), longest, dtype=torch.long)
    labels = torch.full((len(items), longest), -100)
    for i, (x, y) in enumerate(items):
        ids[i, :len(x)], labels[i, :len(y)] = x, y
    return {"input_ids": ids, "labels": labels}


def token_accuracy(eval_pred):
    """A token classifier's compute_metrics: the padded positions (-100) left out."""
    predictions, labels = eval_pred
    real = labels != -100
    return {"token_accuracy": (np.argmax(predictions, axis=-1)[real] == labels[real]).mean(), "tokens": int(real.sum())}


@pytest.mark.parametrize("devices", [1, 2])
def test_a_token_classifiers_batches_of_other_lengths_are_padded_as_the_trainer_pads_them(devices):
    """Batches padded each to its own longest sentence (2-11 tokens): put together padded to the
    longest with -100, so a Trainer's compute_metrics leaves the padding out."""
    data = sentences()
    torch.manual_seed(0)
    model = Tagger()
    result = dptrain.fit(model, data[:30], data[30:], collate_fn=pad_batch, batch_size=4, epochs=1, devices=devices,
                         step=lambda model, batch: model(**batch),     # (its own loss, its logits as it gives them)
                         metrics=dptrain.whole_set(token_accuracy), log=None)
    with torch.no_grad():
        right = [(model(x[None])["logits"][0].argmax(-1) == y) for x, y in data[30:]]
    assert result["test_tokens"] == sum(len(r) for r in right) == sum(len(y) for _, y in data[30:])
    assert result["test_token_accuracy"] == pytest.approx(torch.cat(right).double().mean().item(), abs=1e-12)


def test_preprocess_keeps_what_it_returns_of_each_batch_as_the_trainers_preprocess_logits_for_metrics():
    """A language model's logits over a vocabulary, kept as their arg-max batch by batch: the
    function gets the (N, T) predictions, the labels as they were."""
    kept = []
    def compute(eval_pred):
        kept.append(eval_pred.predictions.shape)
        real = eval_pred.label_ids != -100
        return {"token_accuracy": (eval_pred.predictions[real] == eval_pred.label_ids[real]).mean()}
    data = sentences()
    torch.manual_seed(0)
    model = Tagger()
    result = dptrain.fit(model, data[:30], data[30:], collate_fn=pad_batch, batch_size=4, epochs=1, devices=2,
                         log=None, metrics=dptrain.whole_set(compute, preprocess=lambda logits, y: logits.argmax(-1)))
    assert kept[-1] == (15, 11) and result["test_token_accuracy"] == pytest.approx(result["test_acc"], abs=1e-12)
