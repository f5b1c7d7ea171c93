"""Any loss, split into shards: the shard sums over the summed denominators equal the loss of
the whole batch, whatever the split (never a mean of means, never a second division)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dptrain.engine.losses import LossAdapter
from dptrain.scratch.split import shard_sizes

g = torch.Generator().manual_seed(0)
N, C = 11, 5
LOGITS = torch.randn(N, C, generator=g)
LABELS = torch.randint(0, C, (N,), generator=g)
PADDED = LABELS.clone()
PADDED[[1, 2, 7]] = -100                         # ignored targets, as in padded sequences
PROBS = torch.softmax(torch.randn(N, C, generator=g), dim=1)
PRED, TRUE = torch.randn(N, 3, generator=g), torch.randn(N, 3, generator=g)
BINARY = torch.randint(0, 2, (N, 3), generator=g).float()
SEQ_LOGITS, SEQ_LABELS = torch.randn(N, C, 4, generator=g), torch.randint(0, C, (N, 4), generator=g)

CASES = [
    ("cross-entropy", nn.CrossEntropyLoss(), LOGITS, LABELS),
    ("class weights", nn.CrossEntropyLoss(weight=torch.rand(C, generator=g) + 0.1), LOGITS, LABELS),
    ("ignored targets", nn.CrossEntropyLoss(), LOGITS, PADDED),
    ("weights and ignored", nn.CrossEntropyLoss(weight=torch.rand(C, generator=g) + 0.1), LOGITS, PADDED),
    ("label smoothing", nn.CrossEntropyLoss(label_smoothing=0.1), LOGITS, LABELS),
    ("class probabilities", nn.CrossEntropyLoss(), LOGITS, PROBS),
    ("per position", nn.CrossEntropyLoss(), SEQ_LOGITS, SEQ_LABELS),
    ("nll", nn.NLLLoss(), F.log_softmax(LOGITS, 1), LABELS),
    ("functional cross-entropy", F.cross_entropy, LOGITS, LABELS),
    ("mse", nn.MSELoss(), PRED, TRUE),
    ("mse sum", nn.MSELoss(reduction="sum"), PRED, TRUE),
    ("l1", nn.L1Loss(), PRED, TRUE),
    ("huber", nn.HuberLoss(delta=0.5), PRED, TRUE),
    ("bce with logits", nn.BCEWithLogitsLoss(pos_weight=torch.tensor([1.0, 2.0, 0.5])), PRED, BINARY),
    ("kl batchmean", nn.KLDivLoss(reduction="batchmean"), F.log_softmax(LOGITS, 1), PROBS),
    ("a plain function (mean)", lambda out, y: ((out - y) ** 2).mean(), PRED, TRUE),
]


def whole(loss, out, y):
    return loss(out, y)


@pytest.mark.parametrize("name, loss, out, y", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_shards_add_up_to_the_whole_batch(name, loss, out, y, parts):
    adapter = LossAdapter(loss)
    sums, counts = 0.0, 0.0
    for o, t in zip(torch.split(out, shard_sizes(N, parts, even_split=False)),
                    torch.split(y, shard_sizes(N, parts, even_split=False))):
        sums += adapter(o, t)
        count = adapter.count(t)
        counts = counts + (1 if count is None else count)
    got = sums if adapter.reduction == "sum" else sums / counts
    torch.testing.assert_close(got, whole(loss, out, y), rtol=1e-5, atol=1e-6)


def test_a_sum_reduction_is_not_divided():
    adapter = LossAdapter(nn.MSELoss(reduction="sum"))
    assert adapter.count(TRUE) is None
    adapter = LossAdapter(lambda o, t: ((o - t) ** 2).sum(), reduction="sum")
    assert adapter.count(TRUE) is None


def test_accuracy_counts_the_targets_that_are_not_ignored():
    adapter = LossAdapter(nn.CrossEntropyLoss())
    correct, count = adapter.correct(LOGITS, PADDED)
    kept = PADDED != -100
    assert float(count) == int(kept.sum())
    assert int(correct) == int(((LOGITS.argmax(1) == PADDED) & kept).sum())
    # An ignored class that an arg-max can be (0 here) is neither a hit nor counted, and
    # class weights do not weigh accuracy.
    weighted = LossAdapter(nn.CrossEntropyLoss(ignore_index=0, weight=torch.rand(LOGITS.shape[1]) + 1))
    correct, count = weighted.correct(LOGITS, PADDED.clamp(min=0))
    kept = PADDED.clamp(min=0) != 0
    assert float(count) == int(kept.sum()) and 0 < int(kept.sum()) < len(PADDED)
    assert int(correct) == int(((LOGITS.argmax(1) == PADDED.clamp(min=0)) & kept).sum())
    assert ((LOGITS.argmax(1) == 0) & ~kept).any()      # the case that matters is there
    assert LossAdapter(nn.MSELoss()).correct(PRED, TRUE) is None


def test_unsplittable_reductions_are_refused():
    with pytest.raises(ValueError, match="cannot be split over devices"):
        LossAdapter(nn.MSELoss(reduction="none"))
    with pytest.raises(ValueError, match="contradicts the loss's own reduction"):
        LossAdapter(nn.MSELoss(), reduction="sum")
    with pytest.raises(ValueError, match="not one number"):
        LossAdapter(lambda o, t: (o - t) ** 2)(PRED, TRUE)


def test_a_dict_output_gives_its_logits_and_other_outputs_name_the_fix():
    from dptrain.engine.model_outputs import loss_input
    logits = torch.randn(4, 3)
    assert loss_input({"loss": None, "logits": logits}) is logits
    with pytest.raises(TypeError, match=r"keys out, hidden.*forward=lambda model, batch"):
        loss_input({"out": logits, "hidden": logits})
    with pytest.raises(TypeError, match=r"returned a tuple of 2.*forward=lambda model, batch: "
                                        r"\(model\(batch\[0\]\)\[0\], batch\[1\]\)"):
        loss_input((logits, logits))
    # A loss of the user's own gets them whole, autocast's bf16 widened to float32.
    whole = loss_input({"out": logits.bfloat16(), "hidden": (logits, 3)}, whole=True)
    assert whole["out"].dtype == torch.float32 and whole["hidden"][0] is logits and whole["hidden"][1] == 3


def test_a_step_may_return_a_hugging_face_style_dict():
    from dptrain.engine.model_outputs import read_step
    loss, logits = torch.tensor(0.5), torch.randn(4, 3)
    assert read_step({"loss": loss, "logits": logits}) == (loss, logits)
    assert read_step({"loss": loss, "count": 7}) == ((loss, 7), None)
    assert read_step(loss) == (loss, None)
    with pytest.raises(ValueError, match="no 'loss'.*labels"):
        read_step({"loss": None, "logits": logits})


def test_a_loss_that_takes_the_batch_gets_it_and_may_return_its_own_count():
    def weighted(output, target, batch):
        return (batch["w"] * (output - target) ** 2).sum(), batch["w"].sum()
    adapter = LossAdapter(weighted)
    batch = {"w": torch.tensor([1.0, 3.0])}
    value, count = adapter.measure(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]), batch)
    assert float(value) == 13.0 and float(count) == 4.0 and adapter.pairs and adapter.takes_batch
    plain = LossAdapter(lambda output, target: ((output - target[0]).abs() * target[1]).mean())
    value, count = plain.measure(torch.tensor([1.0, 2.0]), (torch.zeros(2), torch.ones(2)))
    assert float(value) == 3.0 and count == 2 and plain.pairs is False    # a (y, w) target counts samples


def test_class_weights_whose_batch_sum_is_below_one_train_as_on_one_device():
    import dptrain
    weight = torch.tensor([0.1, 0.2, 0.05])
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    torch.manual_seed(0)
    plain = nn.Linear(4, 3)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    nn.CrossEntropyLoss(weight=weight)(plain(X[:4]), y[:4]).backward()     # weights of 4 samples: < 1
    opt.step()
    from dptrain.engine.model_engine import ModelEngine
    from dptrain.engine.task import Task
    engine = ModelEngine(Task(model, (), loss=nn.CrossEntropyLoss(weight=weight), optimizer="sgd", lr=0.1),
                         [dptrain.cpu(0)])
    engine.prepare((X[:1], y[:1]), 0.1)
    engine.train_batch((X[:4], y[:4]))
    for p, q in zip(plain.parameters(), model.parameters()):
        torch.testing.assert_close(p, q)


def test_accuracy_against_probability_targets_is_the_argmax_class():
    output = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0]])
    target = torch.tensor([[0.8, 0.1, 0.1], [0.6, 0.3, 0.1], [0.0, 0.2, 0.8]])
    hits, count = LossAdapter(nn.CrossEntropyLoss()).correct(output, target)
    assert int(hits) == 2 and count == 3


@pytest.mark.parametrize("devices", [1, 2])
def test_a_partial_of_a_torch_loss_function_is_its_module(devices):
    """``functools.partial(F.cross_entropy, label_smoothing=0.1)`` was given the batch as its
    ``weight`` ("argument 'weight' must be Tensor, not tuple"): torch's third argument has a
    default, so it is not asked for; and it counts as ``nn.CrossEntropyLoss(label_smoothing=0.1)``
    (ignored targets left out of the mean, accuracy scored)."""
    import functools
    import dptrain
    from dptrain.engine.loss_kinds import as_module, takes_batch
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(24, 4, generator=g), torch.randint(0, 3, (24,), generator=g)
    y[::5] = -100

    def run(loss):
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        result = dptrain.fit(model, (X, y), (X, y), loss=loss, epochs=1, batch_size=8, lr=0.5, shuffle=False,
                             devices=devices, log=None, progress=False)
        return model.weight.detach(), result
    got, result = run(functools.partial(F.cross_entropy, label_smoothing=0.1))
    want, want_result = run(nn.CrossEntropyLoss(label_smoothing=0.1))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert result["test_loss"] == pytest.approx(want_result["test_loss"]) and "test_acc" in result
    assert isinstance(as_module(functools.partial(F.mse_loss, reduction="sum")), nn.MSELoss)
    assert as_module(functools.partial(F.mse_loss, nonsense=1)).func is F.mse_loss      # (kept as given)
    assert not takes_batch(F.cross_entropy) and takes_batch(lambda out, y, batch=None: 0)
    assert takes_batch(lambda out, y, b: 0) and not takes_batch(lambda out, y, w=None: 0)
