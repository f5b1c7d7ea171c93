"""``dptrain.fit`` in 2 processes: the same training as one device on the global batch, every
sample once over all ranks and devices, and the same result in every rank."""
import functools
import math

import pytest
import torch
from torch import nn

import dptrain
from tests.distributed.helpers import run_workers
from tests.engine.test_model_engine import OPTIMIZERS, TwoInputs, data, mlp
from tests.run.test_fit import Recorded


def fit_both(rank, world, devices_per_rank):
    """Two user models (an MLP with MSE on tensors, a dict-batch model with cross-entropy),
    SGD with momentum and AdamW, per-batch schedules; returns weights and histories. Several
    processes evaluate by batches of 4, one device by the training's 10."""
    out = []
    g = torch.Generator().manual_seed(5)
    for make, kind, loss, opt in ((mlp, "regression", nn.MSELoss(), "sgd"),
                                  (TwoInputs, "dict", nn.CrossEntropyLoss(), "adamw")):
        torch.manual_seed(rank)                  # rank 0's initial weights must win
        model = make()
        train = data(kind, 45, g)
        result = dptrain.fit(model, train, data(kind, 13, g), loss=loss, optimizer=OPTIMIZERS[opt],
                             scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2),
                             scheduler_interval="batch", epochs=2, batch_size=10,
                             eval_batch_size=4 if world > 1 else None,      # (the figures: the same sums)
                             devices=devices_per_rank[rank] if world > 1 else devices_per_rank, log=None)
        out.append(([p.detach().tolist() for p in model.parameters()],
                    [{k: v for k, v in h.items() if k != "sec"} for h in result["history"]]))
        # Afterwards the model is the user's again: no hook of ours fires on its own backward.
        loss(*((model(train[0]), train[1]) if kind != "dict"
               else (model(train["image"], train["extra"]), train["label"]))).backward()
    return out


def test_two_processes_equal_one_device():
    want = fit_both(0, 1, 1)
    for ranks in (run_workers(fit_both, (1, 1)), run_workers(fit_both, (2, 1))):
        for (params, history), (want_params, want_history) in zip(ranks[0], want):
            for p, q in zip(params, want_params):
                torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
            for row, want_row in zip(history, want_history):
                for k in want_row:
                    assert abs(row[k] - want_row[k]) <= 1e-5 * max(1.0, abs(want_row[k])), (k, row, want_row)
        assert ranks[0] == ranks[1]               # every rank ends with the same weights and history


def every_sample(rank, world):
    seen = []

    def step(model, batch):
        if model.training:                       # not the evaluation's batches
            seen.append(batch["id"].tolist())
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"])
    result = dptrain.fit(nn.Linear(1, 3), Recorded(29), Recorded(11), step=step, epochs=2, batch_size=8,
                         num_workers=2, devices=2, log=None)
    return seen, result["test_loss"]


def test_every_sample_once_per_epoch_over_all_ranks_and_devices():
    (a, loss_a), (b, loss_b) = run_workers(every_sample)
    ids = sorted(i for ids in a + b for i in ids)
    assert len(ids) == 29 * 2 and sorted(set(ids)) == list(range(29))
    assert loss_a == loss_b


def fit_compiled(rank, world, compile):
    torch.manual_seed(0)
    model = mlp()
    g = torch.Generator().manual_seed(5)
    dptrain.fit(model, data("regression", 40, g), loss=nn.MSELoss(), optimizer=OPTIMIZERS["sgd"], epochs=2,
                batch_size=10, devices=1, compile=compile, log=None)
    return [p.detach().tolist() for p in model.parameters()]


def test_compiled_in_two_processes_equals_eager_in_one():
    want = fit_compiled(0, 1, None)
    ranks = run_workers(fit_compiled, True)
    for got in ranks:
        for p, q in zip(got, want):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)


def stop_on_one_rank(rank, world):
    """Rank 1 alone asks to stop at epoch 2, batch 2; rank 0's callbacks never ask."""
    class StopAt(dptrain.Callback):
        def __init__(self):
            self.last = None

        def on_batch_end(self, run, batch):
            self.last = (batch.epoch, batch.batch)
            if run.rank == 1 and self.last == (2, 2):
                run.stop("rank 1 asked")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    cb = StopAt()
    result = dptrain.fit(mlp(), data("regression", 60, g), loss=nn.MSELoss(), epochs=4, batch_size=10, devices=1,
                         callbacks=[cb], log=None, progress=False)
    return cb.last, len(result["history"])


def test_a_stop_asked_by_one_rank_ends_every_rank_after_the_same_batch():
    a, b = run_workers(stop_on_one_rank)
    assert a == b == ((2, 3), 2)       # heard with batch 3's gradients, so both end after it


def early_stopping(rank, world):
    """Early stopping on the EMA's test loss, restoring the best epoch's average at the end."""
    from dptrain.callbacks import EMA, EarlyStopping
    from tests.callbacks.test_training import train
    stop = EarlyStopping("test_loss", patience=2, restore_best_weights=True)
    model, result = train(1, [stop, EMA(0.5, evaluate=True)], epochs=30, lr=0.3)
    return (len(result["history"]), stop.stopped_epoch, stop.watch.best_epoch,
            [r["test_loss"] for r in result["history"]], [p.detach().flatten().tolist() for p in model.parameters()])


def test_early_stopping_stops_every_rank_at_the_epoch_one_device_stops():
    one = early_stopping(0, 1)
    a, b = run_workers(early_stopping)
    assert a[:3] == b[:3] == one[:3] and one[0] < 30
    assert a[3] == b[3] and a[3] == pytest.approx(one[3], rel=1e-5)        # the average's figures
    for p, q, w in zip(a[4], b[4], one[4]):                                # its best epoch's, restored
        assert p == q and p == pytest.approx(w, rel=1e-5, abs=1e-6)


def unused_parameters(rank, world):
    """Partly's never-, sometimes- and rarely-used layers: each rank steps on its part of the
    global batches; returns the largest difference to the plain loop on the whole batches."""
    from dptrain.core.parts import even_part
    from dptrain.engine.model_engine import ModelEngine
    from dptrain.engine.task import Task
    from tests.engine.test_model_engine import Partly, plain_steps
    g = torch.Generator().manual_seed(3)
    batches = [data("regression", n, g) for n in (12, 12, 9, 12)]
    optimizer = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
    want = plain_steps(Partly, batches, nn.MSELoss(), optimizer,
                       lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0))[-1]
    torch.manual_seed(0)
    engine = ModelEngine(Task(Partly(), (), loss=nn.MSELoss(), optimizer=optimizer), [dptrain.cpu(0)])
    for X, y in batches:
        start, size = even_part(len(X), world, rank)
        engine.train_batch((X[start:start + size], y[start:start + size]))
    return max(float((p - q).abs().max()) for p, q in zip(engine.replicas[0].parameters(), want))


def test_parameters_a_step_does_not_use_train_as_plain_pytorch_on_two_processes():
    assert all(diff < 1e-5 for diff in run_workers(unused_parameters))


def frozen_mid_run(rank, world, devices):
    from tests.run.test_callback_edits import fit_freeze_then_thaw, plain_freeze_then_thaw
    net = fit_freeze_then_thaw(devices)
    return max(float((p - q).abs().max()) for p, q in zip(net.parameters(), plain_freeze_then_thaw().parameters()))


@pytest.mark.parametrize("devices", [1, 2])
def test_a_layer_frozen_mid_run_on_two_processes_trains_as_plain_pytorch(devices):
    assert all(diff < 1e-6 for diff in run_workers(frozen_mid_run, devices))


def unfrozen_mid_run(rank, world, variant):
    from tests.run.test_unfreezing import fit, model, plain
    net = model(frozen=True)
    fit(net, 1, variant, "on_batch_end")
    return max(float((p - q).abs().max()) for p, q in zip(net.parameters(), plain(variant, 4)[0].parameters()))


@pytest.mark.parametrize("variant", ["all", "group"])
def test_a_layer_unfrozen_mid_run_on_two_processes_trains_as_plain_pytorch(variant):
    assert all(diff < 1e-6 for diff in run_workers(unfrozen_mid_run, variant))


def unfrozen_otherwise_on_one_rank(rank, world):
    from tests.run.test_unfreezing import BATCH, data, model, optimizer_for
    net = model(frozen=True)

    class Unfreeze(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            if epoch == 2:
                net[0].requires_grad_(True)
                net[2].weight.requires_grad_(rank == 0)      # rank 1 also freezes the head's weight
    try:
        dptrain.fit(net, data(), loss=nn.CrossEntropyLoss(), optimizer=optimizer_for(net, "all"), epochs=2,
                    batch_size=BATCH, devices=1, callbacks=[Unfreeze()], log=None)
    except ValueError as e:
        return str(e)


def test_layers_unfrozen_otherwise_on_one_process_stop_every_process_naming_it():
    said = run_workers(unfrozen_otherwise_on_one_rank)
    assert all(s and "the processes disagree on what trains: rank 0 trains 4 parameters in 1 optimizer groups, "
               "rank 1 3 in 1" in s for s in said), said


def fp16_scaled(rank, world):
    from tests.engine.test_loss_scale import fit, largest_difference, model, plain, tiny
    net = model()
    fit(net, 1.0, 1, loss=tiny, lr=100.0)
    overflowing = model()
    result = fit(overflowing, 1e4, 1, epochs=1)
    return largest_difference(net, plain(1.0, loss=tiny, lr=100.0)[0]), result["history"][0]["train_loss"]


def test_fp16_on_two_processes_scales_the_loss_as_a_grad_scaler():
    (a, loss_a), (b, loss_b) = run_workers(fp16_scaled)
    assert a < 5e-6 and b < 5e-6 and loss_a == loss_b and math.isfinite(loss_a)


def clipped(rank, world, max_value=None):
    from dptrain.core.parts import even_part
    from dptrain.engine.model_engine import ModelEngine
    from dptrain.engine.task import Task
    from tests.engine.test_model_engine import clipped_plain_steps
    g = torch.Generator().manual_seed(4)
    batches = [data("regression", n, g) for n in (12, 12, 7, 12)]
    optimizer = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    want, norms = clipped_plain_steps(mlp, batches, nn.MSELoss(), optimizer, 0.1, max_value)
    torch.manual_seed(0)
    engine = ModelEngine(Task(mlp(), (), loss=nn.MSELoss(), optimizer=optimizer), [dptrain.cpu(0)],
                         clip_grad_norm=0.1, clip_grad_value=max_value)
    diffs = []
    for (X, y), norm in zip(batches, norms[::2] if max_value else norms):
        start, size = even_part(len(X), world, rank)
        diffs.append(abs(float(engine.train_batch((X[start:start + size], y[start:start + size])).grad_norm) - norm))
    return max(diffs), max(float((p - q).abs().max()) for p, q in zip(engine.replicas[0].parameters(), want[-1]))


def test_clipping_on_two_processes_takes_the_one_device_steps():
    for norm_diff, weight_diff in run_workers(clipped) + run_workers(clipped, 0.01):    # by norm, then by value
        assert norm_diff < 1e-5 and weight_diff < 1e-5


def predict_indices(rank, world):
    """A model that returns its input: the outputs are the samples' indices, in order."""
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    X = torch.arange(29, dtype=torch.float32).unsqueeze(1)
    return dptrain.predict(model, X, batch_size=8, devices=2).squeeze(1).tolist()


def test_predict_on_two_processes_gives_every_sample_once_in_order():
    a, b = run_workers(predict_indices)
    assert a == b == [float(i) for i in range(29)]


def evaluated(rank, world, differ=False):
    """The test-file model's figures on 53 samples (shards over 2 processes x 2 devices)."""
    from tests.run.test_evaluate import classification, errors
    torch.manual_seed(rank if differ else 0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    try:
        return dptrain.evaluate(model, classification(53, 1), metrics={"err": errors}, batch_size=16, devices=2)
    except ValueError as e:
        return str(e)


def test_evaluate_on_two_processes_equals_one_device_and_refuses_different_models():
    want = evaluated(0, 1)
    a, b = run_workers(evaluated)
    assert a == b and a == pytest.approx(want, rel=1e-6)
    a, b = run_workers(evaluated, True)
    assert a == b and "the model's weights differ between processes (rank 1's from rank 0's)" in a


def on_rank_zero_alone(rank, world):
    """After fit, rank 0 alone predicts and evaluates (``if rank == 0:``, ``local=True``) while
    rank 1 goes on to the end; without ``local`` the call waited for rank 1 and failed."""
    from tests.run.test_evaluate import classification, errors
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    dptrain.fit(model, classification(64, 0), epochs=1, batch_size=16, devices=1, log=None)
    if rank != 0:
        return None
    X, y = classification(53, 1)
    metrics = {"err": errors}
    try:
        import torchmetrics
        metrics["accuracy"] = torchmetrics.classification.MulticlassAccuracy(num_classes=2, average="micro")
    except ImportError:
        pass
    got = dptrain.evaluate(model, (X, y), metrics=metrics, batch_size=16, devices=2, local=True)
    out = dptrain.predict(model, X, batch_size=16, devices=2, local=True)
    with torch.no_grad():
        want = model(X)
    return got, float((out - want).abs().max()), float(nn.functional.cross_entropy(want, y)), \
        float((want.argmax(1) != y).float().mean())


def test_predict_and_evaluate_on_rank_zero_alone_with_local():
    got, out_diff, loss, err = run_workers(on_rank_zero_alone)[0]
    assert out_diff < 1e-6 and got["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert got["test_err"] == pytest.approx(err) and got["test_acc"] == pytest.approx(1 - err)
    assert got.get("test_accuracy", 1 - err) == pytest.approx(1 - err)      # torchmetrics, when installed


def moved_in_a_callback(rank, world):
    """A callback that moves the model (``.to("cpu:0")``, which copies every tensor, as
    ``.cpu()`` and back does on a GPU) or predicts with it at each epoch's end: the run is the
    one without it. (The gradients, views of the buckets, were moved off them: each process
    then stepped on its own gradient, and the processes' weights parted.)"""
    torch.manual_seed(0)
    X, y = torch.randn(64, 6), torch.randint(0, 2, (64,))

    class Moves(dptrain.Callback):
        def __init__(self, how):
            self.how = how

        def on_epoch_end(self, run, epoch, row):
            if self.how == "to":
                run.model.to(torch.device("cpu", 0))
            elif self.how == "predict":
                dptrain.predict(run.model, X)
    out = []
    for how in (None, "to", "predict"):
        torch.manual_seed(0)
        model = nn.Linear(6, 2)
        dptrain.fit(model, (X, y), epochs=3, batch_size=16, devices=1, log=None, optimizer="sgd", lr=0.5,
                    callbacks=[Moves(how)])
        out.append([p.detach().tolist() for p in model.parameters()])
    return out


def test_a_callback_that_moves_the_model_or_predicts_leaves_the_processes_training_together():
    a, b = run_workers(moved_in_a_callback)
    assert a == b and a[1] == a[0] and a[2] == a[0]


def accumulated(rank, world):
    """Micro-batches of 12 (6 per process, 3 per device) in groups of 3: updates of 36."""
    from tests.run.test_accumulation import train
    model, result = train(2 if world > 1 else 1, 12 if world > 1 else 36, 3 if world > 1 else 1)
    return [p.detach().tolist() for p in model.parameters()], result["history"][-1]["train_loss"]


def test_accumulation_on_two_processes_equals_one_batch_on_one_device():
    want, want_loss = accumulated(0, 1)
    for params, loss in run_workers(accumulated):
        for p, q in zip(params, want):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-4, atol=1e-5)
        assert abs(loss - want_loss) < 1e-5 * abs(want_loss)


def whole_set_metrics(rank, world):
    from tests.engine.test_stateful_metrics import fit_with_metrics
    got, _, _ = fit_with_metrics(2)
    return got


def test_torchmetrics_on_two_processes_equal_one_device_over_the_whole_set():
    """101 evaluation samples over 2 processes x 2 devices: shards of 26, 25, 25, 25."""
    pytest.importorskip("torchmetrics")
    from tests.engine.test_stateful_metrics import fit_with_metrics
    _, want, _ = fit_with_metrics(1)
    for got in run_workers(whole_set_metrics):
        assert got["cm"] == want["cm"]
        assert abs(got["f1"] - want["f1"]) < 1e-6 and abs(got["auc"] - want["auc"]) < 1e-6
        assert abs(got["whole_auc"] - want["auc"]) < 1e-6 and got["whole_n"] == 101    # (dptrain.whole_set)


def disagreeing(rank, world, what):
    """Rank 1 differs from rank 0 in one setting only."""
    torch.manual_seed(0)
    odd = rank == 1
    model = nn.Sequential(nn.Linear(4, 8 if not (odd and what == "model") else 6), nn.ReLU(), nn.Linear(
        8 if not (odd and what == "model") else 6, 2))
    n = 1000 if odd and what == "data" else 1024
    X, y = torch.randn(n, 4, generator=torch.Generator().manual_seed(1)), torch.zeros(n, dtype=torch.long)
    try:
        dptrain.fit(model, (X, y), (X[:64], y[:64]), epochs=1, batch_size=32,
                    eval_batch_size=16 if odd and what == "eval_batch_size" else None,
                    lr=0.5 if odd and what == "lr" else 0.1,
                    optimizer="adam" if odd and what == "optimizer" else "sgd", devices=1, log=None,
                    eval_every=2 if odd and what == "eval_every" else 1)
    except ValueError as e:
        return str(e)
    return "trained"


@pytest.mark.parametrize("what, says", [
    ("lr", "the processes disagree on the learning rate: rank 0 has 0.1, rank 1 has 0.5. Every process"),
    ("optimizer", "the processes disagree on the optimizer: rank 0 has sgd, rank 1 has adam."),
    ("eval_every", "the processes disagree on the eval_every: rank 0 has 1, rank 1 has 2."),
    ("data", "the processes disagree on the training data: rank 0 has 1024 samples, content "),
    ("eval_batch_size", "the processes disagree on the evaluation batch size: rank 0 has [32], rank 1 has [16]."),
    ("model", "the processes disagree on the model: rank 0 has Sequential: 0.weight 8x4 float32"),
])
def test_processes_that_disagree_are_stopped_before_any_batch_naming_the_setting(what, says):
    for message in run_workers(disagreeing, what):
        assert message.startswith(says), message
        assert ("no DistributedSampler or slicing by rank" in message) == (what == "data"), message


def dropout_masks(rank, world):
    """The masks dropout draws in training, as each rank sees them."""
    masks = []

    class Record(dptrain.Callback):
        def on_batch_start(self, run, epoch, batch):
            masks.append(nn.functional.dropout(torch.ones(16), 0.5).tolist())
    torch.manual_seed(0)
    dptrain.fit(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2)),
                (torch.randn(64, 4), torch.zeros(64, dtype=torch.long)), epochs=1, batch_size=16, devices=1,
                callbacks=[Record()], log=None)
    return masks


def test_every_rank_draws_its_own_dropout_masks():
    a, b = run_workers(dropout_masks)
    assert len(a) == len(b) == 4 and all(x != y for x, y in zip(a, b))


def all_ignored(rank, world):
    """Three batches of four have no target that counts: skipped, or the stop's message."""
    from dptrain.core.errors import NonFiniteLoss
    from tests.engine.test_direct_step import data, net
    X, y = data(64)
    y[1:] = -100
    model = net()
    result = dptrain.fit(model, (X, y), devices=1, epochs=1, batch_size=16, lr=0.1, log=None, on_nan="skip",
                         optimizer=torch.optim.SGD)
    try:
        dptrain.fit(net(), (X, y), devices=1, epochs=1, batch_size=16, lr=0.1, log=None, optimizer=torch.optim.SGD)
        said = None
    except NonFiniteLoss as e:
        said = str(e)
    return [p.detach().tolist() for p in model.parameters()], result["history"][0]["skipped"], said


def test_a_batch_with_no_counted_target_is_skipped_or_named_as_on_one_process():
    want = all_ignored(0, 1)
    ranks = run_workers(all_ignored, world_size=2)
    assert want[1] == 3 and want[2] is not None and "all ignore_index" in want[2]
    for params, skipped, said in ranks:
        assert skipped == want[1] and said == want[2]       # the same batch named, not the next one
        for p, q in zip(params, want[0]):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)


def run_freed_after_fit(rank, world):
    """Whether fit's run was freed when fit returned, with the collector off (2 processes: the
    bucket reducer, the collective, gloo's objects go with it)."""
    import gc
    import weakref
    seen = {}

    class Keep(dptrain.Callback):
        def on_fit_start(self, run):
            seen["run"] = weakref.ref(run)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)   # torch._dynamo's import cycle, outside
    g = torch.Generator().manual_seed(0)             # the same data in every process
    X, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    gc.collect()
    gc.disable()
    try:
        dptrain.fit(nn.Linear(4, 3), (X, y), epochs=2, batch_size=16, log=None, progress=False, callbacks=[Keep()])
        return seen["run"]() is not None
    finally:
        gc.enable()


def test_fit_frees_its_run_in_every_process():
    assert run_workers(run_freed_after_fit) == [False, False]


def trained_figures(rank, world):
    from tests.engine.test_train_figures import fit
    return fit(1, lr=0.5, objects=True)[1]["history"]


def test_training_figures_on_two_processes_equal_one_device():
    """train_metrics: each process scores its part of every batch; the sums meet with the loss's."""
    want = trained_figures(0, 1)
    for got in run_workers(trained_figures):
        for row, want_row in zip(got, want):
            assert row["train_acc"] == pytest.approx(want_row["train_acc"], abs=1e-12)
            assert row["train_mae"] == pytest.approx(want_row["train_mae"], abs=1e-12)
            assert row["train_loss"] == pytest.approx(want_row["train_loss"], rel=1e-6)
            assert row["train_f1"] == pytest.approx(want_row["train_f1"], abs=1e-6)     # a metric object


def limited(rank, world, directory=None):
    """``max_steps`` 13 (mid-epoch 2), then resumed to 27, against 27 at once."""
    from tests.run.test_step_limit import train
    if directory is None:
        model, result = train(max_steps=27)
    else:
        train(max_steps=13, checkpoint_dir=directory)
        model, result = train(max_steps=27, checkpoint_dir=directory, resume=True)
    return [p.detach().tolist() for p in model.parameters()], [h["train_loss"] for h in result["history"]]


def test_max_steps_on_two_processes_ends_mid_epoch_and_resumes_as_one_device(tmp_path):
    want_params, want_losses = limited(0, 1)
    for params, losses in run_workers(limited, str(tmp_path)):
        for p, q in zip(params, want_params):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-4, atol=1e-5)
        assert losses == pytest.approx(want_losses, rel=1e-5) and len(losses) == 3


def timed(rank, world, directory=None):
    """``max_time`` passed on rank 1's clock only, mid-epoch 2, then resumed; or unbroken."""
    from dptrain.run import time_limit
    from tests.run.test_time_limit import Clock, PassTheTime, train
    if directory is None:
        model, result = train()
        stopped_at = None
    else:
        clock = time_limit.now = Clock()
        cut = train(callbacks=[PassTheTime(clock, 2, 3, rank=1)], max_time=60, checkpoint_dir=directory)[1]
        stopped_at = (cut["timed_out"], cut["history"][-1].get("batches"))
        clock.t = 0.0
        model, result = train(max_time=60, checkpoint_dir=directory, resume=True)
    return [p.detach().tolist() for p in model.parameters()], [h["train_loss"] for h in result["history"]], stopped_at


def test_max_time_passed_on_one_process_stops_every_process_at_one_batch_and_resumes_as_one_device(tmp_path):
    want_params, want_losses, _ = timed(0, 1)
    for params, losses, stopped_at in run_workers(timed, str(tmp_path)):
        assert stopped_at == (True, 4)          # heard with the next batch's gradients: one batch later
        for p, q in zip(params, want_params):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-4, atol=1e-5)
        assert losses == pytest.approx(want_losses, rel=1e-5) and len(losses) == 3


def step_logged(rank, world):
    from tests.run.test_step_log import train
    return train(1, eval_every_n_steps=3, log_grad_norm="parameters", clip_grad_norm=0.5)["step_history"]


def test_logged_steps_and_their_evaluations_on_two_processes_equal_one_device():
    want = step_logged(0, 1)
    each = sorted(k for k in want[1] if k.startswith("grad_norm/"))        # (row 0: step 3's evaluation)
    assert each == ["grad_norm/0.bias", "grad_norm/0.weight", "grad_norm/2.bias", "grad_norm/2.weight"]
    for rows in run_workers(step_logged):
        assert [sorted(r) for r in rows] == [sorted(r) for r in want]
        for key in ("train_loss", "test_loss", "test_acc", "grad_norm", *each):
            assert [r.get(key, 0.0) for r in rows] == pytest.approx([r.get(key, 0.0) for r in want], rel=1e-5)


def step_rows_resumed(rank, world, directory):
    """Step rows of a run ``max_steps=6`` cut in the window of updates 5-8, resumed."""
    from tests.run.test_step_log import train
    train(1, checkpoint_dir=directory, max_steps=6)
    return train(1, checkpoint_dir=directory, resume=True)["step_history"]


def test_step_rows_of_two_processes_resumed_mid_window_equal_one_unbroken_device(tmp_path):
    from tests.run.test_step_log import train
    want = train(1)["step_history"]
    for rows in run_workers(step_rows_resumed, str(tmp_path)):
        assert [r["steps"] for r in rows] == [4] * 5
        assert [r["train_loss"] for r in rows] == pytest.approx([r["train_loss"] for r in want], rel=1e-6)


def resumed_metric_objects(rank, world, directory):
    """train_f1 (a torchmetrics object on the training batches) of an unbroken run, and of one
    stopped by Ctrl-C after batch 3 of epoch 1 and resumed: its state rides in the checkpoint."""
    import torchmetrics as tm
    from dptrain.core.errors import Interrupted
    from tests.engine.test_train_figures import CtrlC, classes, net
    X, y = classes()
    y = y.clamp(max=1)
    kw = dict(loss=nn.CrossEntropyLoss(), epochs=2, batch_size=32, devices=1, train_metrics=True, log=None)
    f1 = lambda: {"f1": tm.classification.MulticlassF1Score(3, average="macro"),     # noqa: E731
                  "f1_of_all": dptrain.whole_set(lambda out, y: tm.functional.classification.multiclass_f1_score(
                      out, y, 3, average="macro"))}    # (the same F1, as a function of the whole set)
    whole = [r["train_f1"] for r in dptrain.fit(net(), (X, y), metrics=f1(), **kw)["history"]]
    try:
        dptrain.fit(net(), (X, y), metrics=f1(), checkpoint_dir=directory, callbacks=[CtrlC(1, 3)], **kw)
    except Interrupted:
        pass
    rows = dptrain.fit(net(), (X, y), metrics=f1(), checkpoint_dir=directory, resume=True, **kw)["history"]
    resumed = [r["train_f1"] for r in rows]
    assert [r["train_f1_of_all"] for r in rows] == pytest.approx(resumed, abs=1e-6)
    return whole, resumed


def test_metric_objects_on_the_training_batches_resume_whole_on_two_processes(tmp_path):
    pytest.importorskip("torchmetrics")
    for whole, resumed in run_workers(resumed_metric_objects, str(tmp_path)):
        assert resumed == pytest.approx(whole, abs=1e-6) and all(v == v for v in resumed)


def streamed(rank, world):
    """A stream on every process (read whole, each keeping its part), a DataLoader whose
    sampler draws by weights, one whose batch sampler makes uneven batches, two evaluation
    sets, then a stream sharded by rank, which the processes' agreement refuses before any
    batch. (With and without a length: read to its end, the same.)"""
    from tests.run import test_samplers
    from tests.run.test_streams import Samples, SizedSamples, rows, train
    model, result = train(SizedSamples(), 1, dropout=0)
    weights = [p.detach().tolist() for p in model.parameters()]
    open_model, open_result = train(Samples(), 1, dropout=0)
    assert [p.detach().tolist() for p in open_model.parameters()] == weights
    assert [(r["batches"], r["samples"]) for r in open_result["history"]] == [(5, 90)] * 3
    sampled, sampled_result = test_samplers.train(test_samplers.weighted(test_samplers.Recorded()), 1)
    sampled_weights = [p.detach().tolist() for p in sampled.parameters()]
    bucketed = test_samplers.train(test_samplers.DataLoader(test_samplers.Recorded(),
                                                            batch_sampler=test_samplers.Buckets(120)), 1)[1]
    from tests.run.test_eval_sets import train as with_sets
    sets = with_sets(1)[1]["history"][-1]
    from tests.run import test_batched_streams as batched     # a stream of batches of 7, 13, 10...
    batch_stream = test_samplers.DataLoader(batched.Batches(noise=0.1, shuffled=True), batch_size=None)
    by_batches = [p.detach().tolist() for p in batched.train(batch_stream, 1)[0].parameters()]
    dispatched_batches = [p.detach().tolist()
                          for p in batched.train(batch_stream, 1, dispatch_batches=True)[0].parameters()]

    class ByRank(SizedSamples):
        def __iter__(self):
            return (s for i, s in enumerate(super().__iter__()) if i % world == rank)
    try:
        train(ByRank(), 1, dropout=0)
        refused = None
    except ValueError as e:
        refused = str(e)
    return (weights, rows(result), refused, sampled_weights, test_samplers.figures(sampled_result),
            test_samplers.figures(bucketed), {k: v for k, v in sets.items() if k.startswith("test")},
            (by_batches, dispatched_batches))


def test_streams_samplers_and_eval_sets_on_two_processes_equal_one_device_and_a_sharded_stream_is_refused():
    from tests.run import test_samplers
    from tests.run.test_streams import SizedSamples, figures, train
    model, result = train(SizedSamples(), 1, dropout=0)
    sampled, sampled_result = test_samplers.train(test_samplers.weighted(test_samplers.Recorded()), 1)
    bucketed = test_samplers.train(test_samplers.DataLoader(test_samplers.Recorded(),
                                                            batch_sampler=test_samplers.Buckets(120)), 1)[1]
    from tests.run.test_eval_sets import train as with_sets
    sets = with_sets(1)[1]["history"][-1]
    from tests.run import test_batched_streams as batched
    by_batches = batched.train(test_samplers.DataLoader(batched.Batches(noise=0.1, shuffled=True), batch_size=None),
                               1)[0]
    for weights, history, refused, sampled_weights, sampled_figures, bucketed_figures, set_figures, batch_weights in \
            run_workers(streamed):
        for each in batch_weights:      # a stream of batches, read by each process, and by rank 0 alone
            for p, q in zip(each, by_batches.parameters()):
                torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
        assert bucketed_figures == pytest.approx(test_samplers.figures(bucketed), rel=1e-5)
        assert set(set_figures) == {k for k in sets if k.startswith("test")} and "test_ood_acc" in set_figures
        assert set_figures == pytest.approx({k: sets[k] for k in set_figures}, rel=1e-5)
        for p, q in zip(weights, model.parameters()):
            torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
        assert [v for r in history for v in r.values()] == pytest.approx(figures(result), rel=1e-5)
        for p, q in zip(sampled_weights, sampled.parameters()):
            torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
        assert sampled_figures == pytest.approx(test_samplers.figures(sampled_result), rel=1e-5)
        assert refused is not None and "the processes disagree on the training data: rank 0 has a stream" in refused
        assert "do not shard it by rank" in refused, refused


def dispatched(rank, world, directory):
    """``dispatch_batches``: rank 0 alone reads the stream (each process counts what it read);
    a run cut by max_steps and resumed; then a stream that fails on rank 0 mid-epoch."""
    from tests.run.test_streams import Samples, SizedSamples, rows, train

    class Counted(SizedSamples):
        read = 0

        def __iter__(self):
            for sample in super().__iter__():
                Counted.read += 1
                yield sample
    model, result = train(Counted(), 1, dropout=0, dispatch_batches=True)
    read = Counted.read
    opened = train(Samples(), 1, dropout=0, dispatch_batches=True, accumulate_grad_batches=2)[1]["history"]
    assert [(r["batches"], r["samples"]) for r in opened] == [(3, 90)] * 3      # (rank 1: the sizes sent)
    assert [r["train_loss"] for r in opened] == pytest.approx(
        [r["train_loss"] for r in train(SizedSamples(), 1, dropout=0, accumulate_grad_batches=2)[1]["history"]])
    figures = dptrain.evaluate(model, Counted(), batch_size=20, devices=1, dispatch_batches=True)
    outputs = dptrain.predict(model, Counted(), batch_size=20, devices=2, dispatch_batches=True)
    inference_read = Counted.read - read
    stream = functools.partial(SizedSamples, noise=0.1, shuffled=True)
    train(stream(), 1, dropout=0, max_steps=7, checkpoint_dir=directory, dispatch_batches=True)
    resumed = train(stream(), 1, dropout=0, max_steps=11, checkpoint_dir=directory, resume=True,
                    dispatch_batches=True)[0]

    class Broken(SizedSamples):
        def __iter__(self):
            for i, sample in enumerate(super().__iter__()):
                if i == 50:
                    raise OSError("the shard server went away")
                yield sample
    try:
        train(Broken(), 1, dropout=0, dispatch_batches=True)
        failed = None
    except Exception as e:      # noqa: BLE001 - what each process says is the test
        failed = f"{type(e).__name__}: {e}"
    return ([p.detach().tolist() for p in model.parameters()], rows(result), read,
            [p.detach().tolist() for p in resumed.parameters()], failed, (figures, outputs.tolist(), inference_read))


def test_a_dispatched_stream_is_read_by_rank_0_alone_and_trains_as_one_device(tmp_path):
    from tests.run.test_streams import SizedSamples, rows, train
    model, result = train(SizedSamples(), 1, dropout=0)
    stream = functools.partial(SizedSamples, noise=0.1, shuffled=True)
    unbroken = train(stream(), 2, dropout=0, max_steps=11)[0]
    outcomes = run_workers(dispatched, str(tmp_path))
    from tests.run.test_streams import X, Y
    whole_set = dptrain.evaluate(model, (X, Y), batch_size=20, devices=1)
    for rank, (weights, history, read, resumed, failed, (figures, outputs, inference_read)) in enumerate(outcomes):
        # evaluate and predict with dispatch_batches: rank 0 reads for both; every process
        # gets the whole set's figures and every output, in order
        assert figures == pytest.approx(whole_set, rel=1e-5)
        assert inference_read >= 2 * 90 if rank == 0 else inference_read <= 2     # (the first sample, for checks)
        with torch.no_grad():
            torch.testing.assert_close(torch.tensor(outputs), model(X), rtol=1e-5, atol=1e-6)
        for p, q in zip(weights, model.parameters()):
            torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
        assert [r["train_loss"] for r in history] == pytest.approx([r["train_loss"] for r in rows(result)], rel=1e-5)
        for p, q in zip(resumed, unbroken.parameters()):
            torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
        assert read == (3 * 90 + 1 if rank == 0 else 1)     # the epochs, and the first sample each looks at
        assert "the shard server went away" in failed
    assert outcomes[0][4].startswith("OSError") and outcomes[1][4].startswith("PeerFailed: rank 0 could not read Broken")


def sharded(rank, world, directory):
    """``sharded_stream``: each process given its share of the rows (every other one), as a
    DDP script shards a stream; unbroken, then cut by max_steps mid-epoch and resumed."""
    from tests.run.test_streams import X, Samples, rows, train

    class Share(Samples):
        """Rows ``rank, rank + 2, ...``: 45 of the 90; it counts what it yields."""
        read = 0

        def order(self):
            return list(range(rank, 90, world))

        def __len__(self):
            return len(self.order())

        def __iter__(self):
            for sample in super().__iter__():
                Share.read += 1
                yield sample
    lines = []
    model, result = train(Share(), 1, dropout=0, sharded_stream=True, log=lines.append)
    read = Share.read
    train(Share(), 1, dropout=0, sharded_stream=True, max_steps=6, checkpoint_dir=directory)
    resumed = train(Share(), 1, dropout=0, sharded_stream=True, max_steps=12, checkpoint_dir=directory,
                    resume=True)[0]
    whole = train(Share(), 1, dropout=0, sharded_stream=True, max_steps=12)[0]
    same = all(torch.equal(p, q) for p, q in zip(resumed.parameters(), whole.parameters()))

    class Unsized(Samples):
        def order(self):
            return list(range(rank, 90, world))
    with pytest.raises(TypeError, match="sharded_stream: Unsized has no __len__, and the processes' shares would "
                                        "end at different batches: give steps_per_epoch=N"):
        train(Unsized(), 1, dropout=0, sharded_stream=True)

    class EvalShare(Samples):
        """The evaluation rows 0-39, unequally: 25 on rank 0 (3 parts of 10), 15 on rank 1 (2)."""
        def order(self):
            return list(range(25)) if rank == 0 else list(range(25, 40))

        def __len__(self):
            return len(self.order())
    evaluated = train(Share(), 1, dropout=0, sharded_stream=True, eval_data=EvalShare())[1]
    figures = dptrain.evaluate(model, EvalShare(), batch_size=20, devices=1, sharded_stream=True)
    # predict: each process its share's outputs, in its order (2 devices: parts of 5 each)
    share = EvalShare().order()
    outputs = dptrain.predict(model, EvalShare(), batch_size=20, devices=2, sharded_stream=True)
    with torch.no_grad():
        predicted = outputs.shape == (len(share), 3) and torch.allclose(outputs, model(X[share]), atol=1e-6)
    return ([p.detach().tolist() for p in model.parameters()], rows(result), read, same, lines, rows(evaluated),
            figures, predicted)


def test_a_sharded_stream_is_read_a_share_a_process_and_trains_as_one_device_on_its_batches(tmp_path):
    """A global batch is every process's next 10 rows; 4 batches an epoch (45 rows a share:
    5 left unread, and said); the same as one device on those batches in that order."""
    from tests.run.test_streams import X, Y, rows, train
    shares = [list(range(r, 90, 2)) for r in range(2)]
    order = [i for b in range(4) for share in shares for i in share[b * 10:(b + 1) * 10]]
    model, result = train((X[order], Y[order]), 1, dropout=0, shuffle=False)
    whole_set = dptrain.evaluate(model, (X[:40], Y[:40]), batch_size=20, devices=1)
    for rank, (weights, history, read, same, lines, evaluated, figures, predicted) in \
            enumerate(run_workers(sharded, str(tmp_path))):
        # An evaluation stream sharded unequally (25 and 15 rows): each share read to its end,
        # the figures those of the whole set, in fit's rows and in evaluate.
        assert [r["test_loss"] for r in evaluated] == pytest.approx([r["test_loss"] for r in history], rel=1e-6)
        assert [r["test_acc"] for r in evaluated] == [r["test_acc"] for r in history]
        for p, q in zip(weights, model.parameters()):
            torch.testing.assert_close(torch.tensor(p), q.detach(), rtol=1e-5, atol=1e-6)
        assert [r["train_loss"] for r in history] == pytest.approx([r["train_loss"] for r in rows(result)], rel=1e-5)
        assert read == 3 * 40 + 1 and same          # its share's 40 rows an epoch (and its first, for the checks)
        assert figures == pytest.approx(whole_set, rel=1e-5) and predicted
        assert any("10 samples of the longer shares are not read each epoch" in line for line in lines) == (rank == 0)


def fit_gan(rank, world, devices, batchnorm=False, accumulate=1):
    """fit with two optimizers (tests/run/test_several_optimizers.py), 2 epochs, a scheduler
    each, an evaluation set each step scores; ``batchnorm``: DCGAN's BatchNorm, synchronised,
    in float64; ``accumulate``: micro-batches a step."""
    from tests.run.test_several_optimizers import data, fit_gan as fit
    from tests.tasks import gan
    torch.manual_seed(rank)
    real, z = data()
    test_real, test_z = data(3, 8)
    extra = {"sync_batchnorm": True} if batchnorm else {}
    dtype = torch.float64 if batchnorm else torch.float32
    torch.set_default_dtype(dtype)
    try:
        model, result, optimizers = fit(gan.GAN(seed=rank, batchnorm=batchnorm), (real.to(dtype), z.to(dtype)),
                                        eval_data=(test_real.to(dtype), test_z.to(dtype)),
                                        devices=devices, epochs=2, batch_size=13, **extra,
                                        accumulate_grad_batches=accumulate,
                                        scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=4))
    finally:
        torch.set_default_dtype(torch.float32)
    return ([p.detach().tolist() for p in model.parameters()],
            [{k: v for k, v in h.items() if k != "sec"} for h in result["history"]],
            [int(s["step"]) for opt in optimizers.values() for s in opt.state.values()])


@pytest.mark.parametrize("devices, batchnorm, accumulate", [(1, False, 1), (2, False, 2), (1, True, 1)])
def test_several_optimizers_on_two_processes_equal_one_device(devices, batchnorm, accumulate):
    """A GAN: rank 1 starts from other weights (rank 0's win), each process trains its part of
    every batch of 13 (uneven parts), and both end with one device's weights and figures
    (with BatchNorm synchronised over the processes too; micro-batches accumulated)."""
    want_params, want_history, want_steps = fit_gan(0, 1, 1, batchnorm, accumulate)
    ranks = run_workers(fit_gan, devices, batchnorm, accumulate)
    params, history, steps = ranks[0]
    for p, q in zip(params, want_params):
        torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
    for row, want_row in zip(history, want_history):
        assert row.keys() == want_row.keys() and "test_generator_loss" in row
        for k in want_row:
            assert abs(row[k] - want_row[k]) <= 1e-5 * max(1.0, abs(want_row[k])), (k, row, want_row)
    # 7 batches an epoch (in groups of 2, the last alone: 4 steps), 2 epochs, each tensor
    assert steps == want_steps == [14 if accumulate == 1 else 8] * len(params)
    assert ranks[0] == ranks[1]


def messages_a_gan_step_sends(rank, world):
    """The collectives each batch after the first calls beside its buckets' exchange."""
    from dptrain.distributed.collective import TorchCollective
    from tests.run.test_several_optimizers import fit_gan
    calls, per_batch = [0], []
    blocking = TorchCollective.all_reduce

    def counted(self, tensor):
        calls[0] += 1
        return blocking(self, tensor)
    TorchCollective.all_reduce = counted

    class Count(dptrain.Callback):
        def on_batch_start(self, run, *args):
            self.before = calls[0]

        def on_batch_end(self, run, batch, *rest):
            per_batch.append(calls[0] - self.before)
    fit_gan(devices=1, batch_size=16, callbacks=[Count()])
    return per_batch


def test_a_step_of_several_optimizers_sends_its_denominators_with_the_gradients():
    """Once the steps are known to return a mean, each update's denominator rides in its last
    bucket: no all_reduce of its own (one each cost the GAN 0.9x DDP's speed: RESULTS.md)."""
    for per_batch in run_workers(messages_a_gan_step_sends):
        assert per_batch[1:] == [0] * 4, per_batch


def combined(rank, world, devices):
    """Several optimizers on one loss (SGD for the weights, Adam for the biases), clipped."""
    from tests.parallel.test_combined import net, parts
    from tests.run.test_combined_fit import SETTINGS, data, schedule
    model = net()
    dptrain.fit(model, data(), optimizer=parts(model), scheduler=schedule, scheduler_interval="batch",
                clip_grad_norm=0.3, devices=[dptrain.cpu(0)] * devices, **SETTINGS)
    return [p.detach().tolist() for p in model.parameters()]


def test_several_optimizers_on_one_loss_on_two_processes_equal_one_device():
    want = combined(0, 1, 1)
    for ranks in (run_workers(combined, 1), run_workers(combined, 2)):
        for params in ranks:
            for p, q in zip(params, want):
                torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)


def sparse_adam(rank, world):
    from tests.parallel.test_sparse import sparse_fit_difference
    return [sparse_fit_difference("cpu:0"), sparse_fit_difference("cpu:0,cpu:1", accumulate=2)]


def test_sparse_gradients_on_two_processes_train_with_sparse_adam_as_the_plain_loop():
    """An EmbeddingBag(sparse=True) with SparseAdam: its gradient crosses the processes sparse
    (summed as DDP sums it), 1 and 2 devices a process, accumulation too."""
    for diffs in run_workers(sparse_adam):
        assert max(diffs) < 1e-6


def batchnorm_small_last_batch(rank, world):
    """67 samples in batches of 32: the last global batch of 3 would give a device one
    sample (rank 1's part, or a device's of it), which BatchNorm refuses to train on."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(67, 8, generator=g), torch.randint(0, 2, (67,), generator=g)
    out = []
    for devices in ("cpu:0", "cpu:0,cpu:1"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
        out.append(dptrain.fit(model, (X, y), epochs=1, batch_size=32, devices=devices, log=None)["history"][0]
                   ["train_loss"])
    return out


def test_a_batchnorm_model_trains_a_last_batch_smaller_than_two_a_device_on_two_processes():
    a, b = run_workers(batchnorm_small_last_batch)
    assert a == b and all(math.isfinite(v) for v in a)


def detection_and_torch_sync_batchnorm(rank, world):
    """Two programs of session 32 on one device a process: a detection model fed by
    ``collate_samples`` (and its predictions), and a DDP script's ``convert_sync_batchnorm``."""
    from torch.utils.data import DataLoader
    from tests.run.test_programs import (TinyDetector, batchnorm_data, batchnorm_model, detection_samples,
                                         detection_step, plain_batchnorm, plain_detector)
    data = detection_samples()
    plain = plain_detector(data)
    torch.manual_seed(0)
    model = TinyDetector()
    loader = DataLoader(data, batch_size=4, collate_fn=dptrain.data.collate_samples)
    dptrain.fit(model, loader, step=detection_step, epochs=1, shuffle=False, devices="cpu:0", optimizer="sgd",
                lr=0.1, log=None)
    detection = max((p - q).abs().max().item() for p, q in zip(plain.parameters(), model.parameters()))
    boxes = dptrain.predict(model, loader, devices="cpu:0")
    lines = []
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(batchnorm_model())
    dptrain.fit(synced, batchnorm_data(), epochs=1, batch_size=16, shuffle=False, devices="cpu:0", optimizer="sgd",
                lr=0.1, log=lines.append)
    batchnorm = max((p - q).abs().max().item() for p, q in zip(plain_batchnorm().state_dict().values(),
                                                                  synced.state_dict().values()))
    return detection, len(boxes), batchnorm, any("torch's SyncBatchNorm" in line for line in lines)


def test_a_detection_model_and_torchs_sync_batchnorm_on_two_processes_train_as_the_plain_loop():
    """Images of several sizes dealt whole to the processes; torch's SyncBatchNorm, which
    refuses CPU tensors across processes, made fit's: both the plain loop on the global batches."""
    ranks = run_workers(detection_and_torch_sync_batchnorm)
    for detection, predicted, batchnorm, _ in ranks:
        assert detection < 1e-6 and predicted == 14 and batchnorm < 1e-5
    assert ranks[0][3]          # said, by rank 0 (which alone prints)


def whole_batch_losses(rank, world, devices):
    """CLIP's loss over the whole global batch (``dptrain.whole_batch``): 37 pairs in batches
    of 12, the last of one pair (a process without a sample), evaluated on 11; and a supervised
    contrastive loss (integer targets and float outputs in one message)."""
    from tests.engine.test_whole_batch import labelled, train
    devices = devices if world > 1 else 1
    model, history = train(devices)
    labels = labelled(devices)
    return ([p.detach().tolist() for p in [*model.parameters(), *labels.parameters()]],
            [(h["train_loss"], h["test_loss"]) for h in history])


@pytest.mark.parametrize("devices", [1, 2])
def test_a_whole_batch_loss_on_two_processes_trains_as_one_device(devices):
    want, want_losses = whole_batch_losses(0, 1, 1)
    ranks = run_workers(whole_batch_losses, devices)
    for params, losses in ranks:
        for p, q in zip(params, want):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-4, atol=1e-5)
        train_losses = [t for t, _ in losses]
        assert train_losses == pytest.approx([t for t, _ in want_losses], rel=1e-5)
    assert ranks[0] == ranks[1]


def last_batch_of_one(rank, world, variant):
    """37 samples in batches of 12: the last batch's one sample leaves a process without any."""
    torch.manual_seed(0)
    X = torch.randn(37, 3)
    y = X.sum(1, keepdim=True)
    losses = {"forward, mean": nn.MSELoss(), "forward, sum": nn.MSELoss(reduction="sum"),
              "(sum, count)": lambda output, target, batch: (((output - target) ** 2).sum(), target.numel())}
    model = nn.Linear(3, 1)
    result = dptrain.fit(model, (X, y), eval_data=None, loss=losses[variant], forward=lambda m, b: (m(b[0]), b[1]),
                         optimizer="sgd", lr=0.01, epochs=2, batch_size=12, shuffle=False, log=None, devices=1)
    return [p.detach().tolist() for p in model.parameters()], result["history"][-1]["train_loss"]


@pytest.mark.parametrize("variant", ["forward, mean", "forward, sum", "(sum, count)"])
def test_a_process_without_a_sample_of_a_batch_counted_after_the_forward_sends_what_the_others_send(variant):
    """Once a hang (a collective mismatch): the empty process's count rode with its gradients
    while the others' came after the forward."""
    want, want_loss = last_batch_of_one(0, 1, variant)
    for params, loss in run_workers(last_batch_of_one, variant, timeout=60):
        for p, q in zip(params, want):
            torch.testing.assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
        assert loss == pytest.approx(want_loss, rel=1e-5)
