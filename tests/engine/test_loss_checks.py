"""The loss's first-batch checks (``engine/loss_checks.py``), through ``LossAdapter`` as the
engine runs them: each wrong pairing of loss and targets is an error naming the fix."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.loss_checks import trains_on_integers
from dptrain.engine.losses import LossAdapter


@pytest.mark.parametrize("out, y, message", [
    (torch.randn(4, 1), torch.randn(4, 1), "at least 2 classes"),           # a regression net, default loss
    (torch.randn(4, 3), torch.randn(4), "float targets of shape"),
    (torch.randn(4, 3), torch.randn(4, 3) * 5, "not class probabilities"),
])
def test_cross_entropy_on_targets_it_cannot_fit_is_a_clear_error(out, y, message):
    with pytest.raises(ValueError, match=message):
        LossAdapter()(out, y)


def test_float_labels_with_cross_entropy_say_to_use_integers():
    with pytest.raises(ValueError, match=r"give class indices as integers \(e.g. y.long\(\)\)"):
        LossAdapter(nn.CrossEntropyLoss()).measure(torch.randn(4, 3), torch.tensor([0.0, 1.0, 2.0, 1.0]))


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("make, error, message", [
    (lambda y: y[:, None], ValueError, r"labels of shape \(\d+, 1\) for outputs of shape \(\d+, 2\): it takes "
                                       r"one label per sample, shape \(\d+,\); give y.squeeze\(-1\) \(NumPy: "
                                       r"y.ravel\(\)"),
    (lambda y: y.float(), ValueError, r"float targets of shape \(16,\): give class indices as integers"),
    (lambda y: y.int(), TypeError, r"needs labels of dtype int64, got torch.int32: give y.long\(\) \(NumPy: "
                                   r"y.astype\(np.int64\)\)")])
def test_keras_style_labels_with_the_default_cross_entropy_name_the_fix_on_any_devices(make, error, message, devices):
    """Labels of shape (N, 1), float labels, int32 labels: torch's own errors before (float labels on
    2 devices: an IndexError in the count taken before the forward)."""
    import dptrain
    X = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(error, match=message):
        dptrain.fit(nn.Linear(4, 2), (X, make((X[:, 0] > 0).long())), epochs=1, batch_size=16, devices=devices,
                    log=None)


@pytest.mark.parametrize("devices", [1, 2])
def test_integer_targets_to_a_loss_that_takes_floats_only_name_the_fix_and_others_train(devices):
    import dptrain
    X = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = (X[:, :1] > 0).long()
    for loss in ("bce", nn.HuberLoss()):            # torch: "result type Float can't be cast ... Long"
        with pytest.raises(TypeError, match=r"needs float targets, got torch.int64: give y.float\(\)"):
            dptrain.fit(nn.Linear(4, 1), (X, y), loss=loss, epochs=1, batch_size=16, devices=devices, log=None)
    for loss in ("mse", "l1"):          # torch takes integers there (2.3's backward did not): so does dptrain
        if trains_on_integers(nn.MSELoss if loss == "mse" else nn.L1Loss):
            assert dptrain.fit(nn.Linear(4, 1), (X, y), loss=loss, epochs=1, batch_size=16, devices=devices,
                               log=None)["history"]
        else:
            with pytest.raises(TypeError, match=r"needs float targets, got torch.int64: give y.float\(\)"):
                dptrain.fit(nn.Linear(4, 1), (X, y), loss=loss, epochs=1, batch_size=16, devices=devices, log=None)


class IntegerTargetsFail(nn.MSELoss):
    """An elementwise loss as torch 2.3's MSE: its backward fails on integer targets."""

    def forward(self, output, target):
        if not target.is_floating_point() and output.requires_grad:
            raise RuntimeError("Found dtype Long but expected Float")
        return super().forward(output, target)


def test_a_torch_whose_loss_fails_on_integer_targets_gets_the_fix_named():
    assert not trains_on_integers(IntegerTargetsFail)
    import dptrain
    X = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match=r"IntegerTargetsFail needs float targets, got torch.int64: give y.float"):
        dptrain.fit(nn.Linear(4, 1), (X, (X[:, :1] > 0).long()), loss=IntegerTargetsFail(), epochs=1, batch_size=16,
                    log=None)


def test_a_segmentations_labels_one_per_position_pass_the_shape_check():
    value, count = LossAdapter().measure(torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4)))
    assert value.shape == () and int(count) == 32


@pytest.mark.parametrize("devices", [1, 2])
def test_a_token_classifiers_scores_in_the_last_dimension_name_movedim_and_train_so(devices):
    """``(N, T, C)`` scores for ``(N, T)`` labels: the error said one label per sample, shape
    ``(N, C)``; it names the move that torch's cross-entropy needs, which then trains as the
    plain loop on the flattened positions."""
    import dptrain
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (16, 6), generator=g)
    labels = ids % 3
    labels[:, 4:] = -100                            # padding
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"labels of shape \(\d+, 6\) for outputs of shape \(\d+, 6, 3\): the model "
                                         r"gives the class scores in its last dimension.*movedim\(-1, 1\)"):
        dptrain.fit(model, (ids, labels), epochs=1, batch_size=16, devices=devices, log=None)
    plain = copy.deepcopy(model)
    dptrain.fit(model, (ids, labels), forward=lambda m, batch: (m(batch[0]).movedim(-1, 1), batch[1]),
                optimizer=torch.optim.SGD, lr=0.5, epochs=1, batch_size=16, shuffle=False, devices=devices, log=None)
    nn.functional.cross_entropy(plain(ids).flatten(0, 1), labels.flatten()).backward()
    with torch.no_grad():
        for p in plain.parameters():
            p -= 0.5 * p.grad
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_hugging_face_token_classifiers_logits_train_classes_last_as_its_own_loss(devices):
    """A model output's ``(N, T, C)`` logits for ``(N, T)`` labels (Hugging Face's token
    classifiers, whose loss flattens them) are the loss's and the accuracy's classes-last, as
    that loss takes them: the plain loop's step on its own loss, the padding (-100) left out;
    the metrics get the logits as the model gives them."""
    import dptrain
    from tests.engine.test_whole_set import Tagger
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 20, (16, 6), generator=g)
    labels = ids % 3
    labels[:, 4:] = -100                            # padding
    data = {"input_ids": ids, "labels": labels}
    torch.manual_seed(0)
    model = Tagger()
    plain = copy.deepcopy(model)
    shapes = []
    result = dptrain.fit(model, data, data, optimizer=torch.optim.SGD, lr=0.5, epochs=1, batch_size=16, shuffle=False,
                         devices=devices, log=None, metrics={"seen": lambda out, y: shapes.append(out.shape) or (0, 1)})
    plain(**data)["loss"].backward()                # (its own: cross-entropy over the flattened tokens)
    with torch.no_grad():
        for p in plain.parameters():
            p -= 0.5 * p.grad
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        out = plain(**data)
    right = out["logits"].argmax(-1)[:, :4] == labels[:, :4]
    assert result["test_acc"] == pytest.approx(right.double().mean().item(), abs=1e-12)
    assert result["test_loss"] == pytest.approx(out["loss"].item(), rel=1e-5)
    assert {s[1:] for s in shapes} == {(6, 3)}      # classes last, as the model gave them


@pytest.mark.parametrize("loss", [nn.MSELoss(), nn.L1Loss(), nn.HuberLoss()])
def test_an_elementwise_loss_on_two_shapes_is_an_error_not_a_broadcast(loss):
    with pytest.raises(ValueError, match=r"outputs of shape \(8, 1\) and targets of shape \(8,\): PyTorch would "
                                         r"broadcast them to \(8, 8\).*y.unsqueeze\(1\)"):
        LossAdapter(loss).measure(torch.randn(8, 1), torch.randn(8))


def test_a_loss_that_sums_without_saying_so_is_found_on_the_first_shard():
    def summed(output, target):
        return ((output - target) ** 2).sum()
    with pytest.raises(ValueError, match="returns a sum over the samples.*pass reduction='sum'"):
        LossAdapter(summed).measure(torch.randn(8, 2), torch.randn(8, 2))
    value, count = LossAdapter(summed, reduction="sum").measure(torch.ones(8, 2), torch.zeros(8, 2))
    assert float(value) == 16.0 and count is None

    class MeanModule(nn.Module):            # no .reduction: taken as a mean, and it is one
        def forward(self, output, target):
            return ((output - target) ** 2).mean()
    value, count = LossAdapter(MeanModule()).measure(torch.ones(8, 2), torch.zeros(8, 2))
    assert float(value) == 8.0 and count == 8
    with pytest.raises(ValueError, match=r"returns a mean over the samples \(.*\), but is taken as reduction=.sum."):
        LossAdapter(MeanModule(), reduction="sum").measure(torch.randn(8, 2), torch.randn(8, 2))


def test_a_loss_coupling_samples_is_an_error_on_several_parts_alone():
    """A weighted mean (a ratio of the batch's sums) and a loss over pairs of a tuple output
    are neither a mean nor a sum of their halves: split, each part would train otherwise."""
    def weighted(output, target):
        return (target[:, 1:] * (output - target[:, :1]) ** 2).sum() / target[:, 1:].sum()

    def pairs(output, target):
        return (output[0] @ output[1].T).logsumexp(1).mean()
    g = torch.Generator().manual_seed(0)
    cases = [(weighted, torch.randn(8, 1, generator=g), torch.rand(8, 2, generator=g),
              r"weighted is a mean weighted otherwise than by samples.*Return \(sum, count\)"),
             (pairs, (torch.randn(8, 3, generator=g), torch.randn(8, 3, generator=g)), None,
              r"couples the samples of a batch.*whole_batch.*\(sum, count\)")]
    for loss, output, target, message in cases:
        adapter = LossAdapter(loss)
        adapter.parts = 2
        with pytest.raises(ValueError, match=message):
            adapter.measure(output, target)
        LossAdapter(loss).measure(output, target)                 # one part: the loss as it is
        declared = LossAdapter(loss, reduction="mean")
        declared.parts = 2
        declared.measure(output, target)                          # declared: each part on its own


def token_mean(output, target):
    """A sequence model's loss as written in a plain loop: the mean over the tokens not ignored."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=-100)


def token_sum(output, target):
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"), \
        (target != -100).sum()


def padded(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 5, (n, 6), generator=g)
    target[torch.arange(6)[None] >= torch.arange(1, n + 1)[:, None] % 6 + 1] = -100     # 1-6 tokens each
    return target


def test_a_mean_over_tokens_is_told_from_the_samples_mean_even_where_every_token_scores_alike():
    """At the start every token's loss is about the same (here exactly: uniform logits), so the
    halves' sample-weighted mean equalled the token mean and the check passed it; on 2 devices
    each part's token mean then counted as its samples (the weights drifted from the plain loop's)."""
    target = padded()
    adapter = LossAdapter(token_mean)
    adapter.parts = 2
    with pytest.raises(ValueError, match=r"token_mean is a mean weighted otherwise than by samples.*Return "
                                         r"\(sum, count\).*reduction='sum'\), \(y != -100\).sum\(\)"):
        adapter.measure(torch.zeros(8, 6, 5), target)
    summed = LossAdapter(token_sum)
    summed.parts = 2
    value, count = summed.measure(torch.zeros(8, 6, 5), target)       # (sum, count): exact, nothing to say
    assert int(count) == int((target != -100).sum())


def test_the_trial_on_one_sample_leaves_the_check_to_the_first_batch_of_several():
    """The trial before training (one sample) set the check done without asking: it never ran."""
    adapter = LossAdapter(token_mean)
    adapter.parts = 2
    adapter.measure(torch.randn(1, 6, 5), padded(1))
    with pytest.raises(ValueError, match="weighted otherwise than by samples"):
        adapter.measure(torch.randn(8, 6, 5), padded())


def test_a_token_mean_on_two_devices_is_an_error_and_its_sum_and_count_trains_as_the_plain_loop():
    g = torch.Generator().manual_seed(1)
    X, target = torch.randint(0, 7, (24, 6), generator=g), padded(24)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(7, 8), nn.Linear(8, 5))
    with pytest.raises(ValueError, match="weighted otherwise than by samples"):
        dptrain.fit(net(), (X, target), loss=token_mean, epochs=1, batch_size=8, devices=2, log=None)
    model = net()
    dptrain.fit(model, (X, target), loss=token_sum, epochs=2, batch_size=8, devices=2, shuffle=False, lr=0.5,
                optimizer=torch.optim.SGD, log=None, progress=False)
    plain = plain_loop(net(), token_mean, X, target, lr=0.5, batch_size=8)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def plain_loop(model, loss, X, y, lr, batch_size, epochs=2):
    """SGD on ``loss`` over ``(X, y)`` in batches, in order: the run dptrain must match."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for i in range(0, len(X), batch_size):
            optimizer.zero_grad()
            loss(model(X[i:i + batch_size]), y[i:i + batch_size]).backward()
            optimizer.step()
    return model


WEIGHTS = torch.tensor([1.0, 5.0, 2.0], dtype=torch.float64)


def class_weighted(output, target):
    """Keras's class_weight as a plain loop writes it: the mean weighted by each sample's class."""
    return F.nll_loss(F.log_softmax(output, -1), target, weight=WEIGHTS)


def class_weighted_sum(output, target):
    return F.nll_loss(F.log_softmax(output, -1), target, weight=WEIGHTS, reduction="sum"), WEIGHTS[target].sum()


def test_a_class_weighted_mean_is_an_error_naming_its_sum_and_weights_which_train_as_the_plain_loop():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(48, 10, generator=g, dtype=torch.float64), torch.randint(0, 3, (48,), generator=g)

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)).double()
    with pytest.raises(ValueError, match=r"class_weighted is a mean weighted otherwise than by samples .* by class "
                                         r"weights\).*\(F.nll_loss\(out, y, weight=w, reduction='sum'\), "
                                         r"w\[y\].sum\(\)\)"):
        dptrain.fit(net(), (X, y), loss=class_weighted, epochs=1, batch_size=16, devices=2, log=None)
    model = net()
    result = dptrain.fit(model, (X, y), (X, y), loss=class_weighted_sum, epochs=2, batch_size=16, devices=2,
                         shuffle=False, lr=0.1, optimizer=torch.optim.SGD, log=None, progress=False)
    plain = plain_loop(net(), class_weighted, X, y, lr=0.1, batch_size=16)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)
    with torch.no_grad():       # the evaluation: the whole set's weighted mean, not a mean of batches'
        assert result["history"][-1]["test_loss"] == pytest.approx(class_weighted(plain(X), y).item(), rel=1e-9)


def test_a_loss_taking_the_batch_is_checked_as_a_plain_function_with_the_batchs_halves():
    """A sum over the batch taking its weights from the batch was not asked: 2 devices trained
    it as their mean, at half the gradient."""
    g = torch.Generator().manual_seed(0)
    X, y, w = (torch.randn(48, 4, generator=g, dtype=torch.float64), torch.randn(48, 1, generator=g,
               dtype=torch.float64), torch.rand(48, generator=g, dtype=torch.float64))

    def weighted_sum(output, target, batch):
        return (batch[2][:, None] * (output - target) ** 2).sum()

    def weighted_mean(output, target, batch):
        return (batch[2][:, None] * (output - target) ** 2).sum() / batch[2].sum()

    def fit(loss, devices, **kw):
        torch.manual_seed(0)
        model = nn.Linear(4, 1).double()
        dptrain.fit(model, (X, y, w), loss=loss, forward=lambda m, b: (m(b[0]), b[1]), epochs=1, batch_size=16,
                    devices=devices, lr=1e-3, optimizer=torch.optim.SGD, shuffle=False, log=None, **kw)
        return model
    for devices in (1, 2):
        with pytest.raises(ValueError, match=r"the loss weighted_sum returns a sum over the samples .* pass "
                                             r"reduction='sum'"):
            fit(weighted_sum, devices)
    with pytest.raises(ValueError, match=r"the loss weighted_mean is a mean weighted otherwise than by samples"):
        fit(weighted_mean, 2)
    one, three = fit(weighted_sum, 1, reduction="sum"), fit(weighted_sum, 3, reduction="sum")
    for p, q in zip(one.parameters(), three.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)


def test_the_checks_probes_build_no_graph():
    """The second probe ran with gradients on (torch warned, once, of a tensor that requires
    grad made a number): every call after the step's own is without them."""
    grad_enabled = []

    def mse(out, y):
        grad_enabled.append(torch.is_grad_enabled())
        return ((out - y) ** 2).mean()
    adapter = LossAdapter(mse)
    adapter.parts = 2
    value, count = adapter.measure(torch.randn(8, 3, requires_grad=True), torch.zeros(8, 3))
    assert count == 8 and value.requires_grad
    assert grad_enabled[0] and len(grad_enabled) >= 6 and not any(grad_enabled[1:]), grad_enabled
