"""Metric objects (torchmetrics) over the whole evaluation set: the figure one device computes,
whatever the number of devices, when the set does not divide by them."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.stateful_metrics import StatefulMetrics, is_stateful, pair_metric_names

torchmetrics = pytest.importorskip("torchmetrics")
from torchmetrics.classification import MulticlassAUROC, MulticlassConfusionMatrix, MulticlassF1Score  # noqa: E402


def sets():
    g = torch.Generator().manual_seed(1)
    return ((torch.randn(300, 8, generator=g), torch.randint(0, 3, (300,), generator=g)),
            (torch.randn(101, 8, generator=g), torch.randint(0, 3, (101,), generator=g)))


def metrics():
    return {"f1": MulticlassF1Score(3, average="macro"), "auc": MulticlassAUROC(3),
            "cm": MulticlassConfusionMatrix(3), "mae": lambda out, y: ((out.argmax(1) - y).abs().sum(), y.numel()),
            # (a function of the whole set, beside them: the same AUC)
            "whole": dptrain.whole_set(lambda out, y: {"auc": MulticlassAUROC(3)(out, y), "n": len(y)})}


def fit_with_metrics(devices):
    """Two epochs; the metrics of the trained model, and on one device over the whole set."""
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    train, (Xe, ye) = sets()
    result = dptrain.fit(model, train, (Xe, ye), epochs=2, batch_size=32, eval_batches=None, devices=devices,
                         metrics=metrics(), log=None)
    with torch.no_grad():
        out = model(Xe)
    want = {"f1": MulticlassF1Score(3, average="macro")(out, ye).item(), "auc": MulticlassAUROC(3)(out, ye).item(),
            "cm": MulticlassConfusionMatrix(3)(out, ye).tolist()}
    want.update(whole_auc=want["auc"], whole_n=101)
    return {k: result[f"test_{k}"] for k in want}, want, result["history"]


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_macro_f1_auc_and_a_confusion_matrix_equal_one_device_over_the_whole_set(devices):
    got, want, history = fit_with_metrics(devices)
    assert got["cm"] == want["cm"] and sum(map(sum, got["cm"])) == 101       # every sample once
    assert got["f1"] == pytest.approx(want["f1"], abs=1e-6) and got["auc"] == pytest.approx(want["auc"], abs=1e-6)
    assert got["whole_auc"] == pytest.approx(want["auc"], abs=1e-6) and got["whole_n"] == 101
    assert [set(h) >= {"test_f1", "test_auc", "test_cm", "test_mae"} for h in history] == [True, True]


def test_the_users_metric_object_is_left_as_it_was():
    f1 = MulticlassF1Score(3)
    stateful = StatefulMetrics({"f1": f1}, [dptrain.cpu(0), dptrain.cpu(1)])
    stateful.update(0, torch.eye(3), torch.arange(3))
    stateful.update(1, torch.eye(3)[[1, 0]], torch.tensor([0, 1]))
    assert stateful.compute() == {"f1": pytest.approx(2 / 3, abs=1e-6)}    # macro: (1/2 + 1/2 + 1) / 3
    assert f1.update_count == 0
    stateful.reset()
    stateful.update(0, torch.eye(3), torch.arange(3))
    assert stateful.compute() == {"f1": 1.0}                               # the last evaluation only


def test_functions_and_objects_are_told_apart():
    found = metrics()
    assert pair_metric_names(found) == ["mae"] and is_stateful(found["f1"]) and not is_stateful(found["mae"])


def test_a_metric_without_merge_state_on_several_devices_says_what_to_do():
    class Old:
        def update(self, *a): ...
        def compute(self): ...
        def reset(self): ...
    with pytest.raises(TypeError, match="has no merge_state.*upgrade torchmetrics"):
        StatefulMetrics({"old": Old()}, [dptrain.cpu(0), dptrain.cpu(1)])


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_metric_collection_gives_each_member_over_the_whole_set(devices):
    """torchmetrics' MetricCollection (Lightning programs' way) has no merge_state: each member is merged."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    train, (Xe, ye) = sets()
    collection = MetricCollection({"f1": MulticlassF1Score(3, average="macro"), "acc": MulticlassAccuracy(3)},
                                  prefix="val_")
    result = dptrain.fit(model, train, (Xe, ye), epochs=1, batch_size=32, devices=devices, log=None,
                         metrics={"cls": collection})
    with torch.no_grad():
        want = collection(model(Xe), ye)
    assert set(want) == {"val_f1", "val_acc"}
    for key, value in want.items():
        assert result[f"test_cls_{key}"] == pytest.approx(value.item(), abs=1e-6)


@pytest.mark.parametrize("devices", [1, 2])
def test_metric_objects_given_alone_or_in_a_list_are_named_by_their_class(devices):
    """``metrics=F1Score(...)`` and ``metrics=[F1Score(...), "accuracy"]``, as Keras takes metric
    objects in its list, named as a MetricCollection of them names them (both were TypeErrors)."""
    from torchmetrics.classification import MulticlassAUROC
    train, (Xe, ye) = sets()
    figures = {}
    for metrics in (MulticlassF1Score(3, average="macro"), [MulticlassAUROC(3), "accuracy", MulticlassF1Score(3)]):
        torch.manual_seed(0)
        model = nn.Linear(8, 3)
        result = dptrain.fit(model, train, (Xe, ye), epochs=1, batch_size=32, devices=devices, log=False,
                             metrics=metrics)
        figures.update({k: v for k, v in result.items() if k.startswith("test_")})
    with torch.no_grad():
        out = model(Xe)
    assert set(figures) == {"test_loss", "test_acc", "test_MulticlassF1Score", "test_MulticlassAUROC"}
    assert figures["test_MulticlassAUROC"] == pytest.approx(MulticlassAUROC(3)(out, ye).item(), abs=1e-6)
    assert figures["test_MulticlassF1Score"] == pytest.approx(MulticlassF1Score(3)(out, ye).item(), abs=1e-6)
    with pytest.raises(ValueError, match=r"two metrics named 'MulticlassF1Score'.*give a dict naming each"):
        dptrain.evaluate(model, (Xe, ye), metrics=[MulticlassF1Score(3), MulticlassF1Score(3, average="micro")])
    with pytest.raises(TypeError, match=r"Keras's names .* and metric objects .*got function"):
        dptrain.evaluate(model, (Xe, ye), metrics=[lambda out, y: (out.sum(), len(y))])


@pytest.mark.parametrize("devices", [1, 2])
def test_a_metric_object_that_does_not_take_the_output_fails_before_training_naming_itself(devices):
    """A binary metric given a 3-class model's scores (it failed after the first epoch's
    training, in torchmetrics' words alone). A (sum, count) function is not called before
    training (it may read the run's state), and its error names it too."""
    calls = []

    def mae(out, y):
        calls.append(len(y))
        return (out - nn.functional.one_hot(y, 4)).abs().sum(), y.numel()      # (4 classes for 3 scores)
    for metrics, named, epochs in (({"f1": torchmetrics.F1Score(task="binary")}, "'f1' (BinaryF1Score)", []),
                                   ({"f1": MulticlassF1Score(3), "mae": mae}, "'mae' (mae)", [1])):
        torch.manual_seed(0)
        model = nn.Linear(8, 3)
        before = [p.clone() for p in model.parameters()]
        train, (Xe, ye) = sets()
        started = []

        class Started(dptrain.Callback):
            def on_epoch_start(self, run, epoch):
                started.append(epoch)
        with pytest.raises(RuntimeError) as failed:
            dptrain.fit(model, train, (Xe[:4], ye[:4]), epochs=1, devices=devices, metrics=metrics, log=None,
                        callbacks=Started())
        assert started == epochs and calls[:1] == ([4 // devices] if epochs else [])     # (first: an evaluation's)
        trained = any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
        assert trained == bool(epochs)
        if hasattr(failed.value, "add_note"):
            shape = (1, 3) if not epochs else (4 // devices, 3)
            assert any(f"raised by metric {named} on an output of shape {shape} and a target of shape ({shape[0]},)"
                       in note for note in failed.value.__notes__), failed.value.__notes__
