"""The callback protocol: hooks called in order, only where defined, states kept by name;
user callbacks in ``fit`` that log, stop early, and stop mid-epoch, alike on 1 and 2 devices."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks import CallbackList
from tests.tasks.user_task import LogLearningRate, StopWhenFlat


class Recorder(dptrain.Callback):
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def on_epoch_end(self, run, epoch, row):
        self.calls.append((self.name, epoch))


class Counter(dptrain.Callback):
    def __init__(self):
        self.n = 0

    def on_batch_end(self, run, batch):
        self.n += 1

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_hooks_run_in_order_and_only_where_defined():
    calls = []
    callbacks = CallbackList([Recorder(calls, "a"), Counter(), Recorder(calls, "b")])
    assert callbacks.wants("on_epoch_end") and callbacks.wants("on_batch_end")
    assert not callbacks.wants("on_fit_start") and not callbacks.wants("on_batch_start")
    callbacks.on_epoch_end(None, 3, {})
    callbacks.on_batch_end(None, None)
    assert calls == [("a", 3), ("b", 3)] and callbacks.callbacks[1].n == 1


def test_states_are_kept_by_name_and_repeated_classes_are_numbered():
    a, b = Counter(), Counter()
    a.n, b.n = 3, 5
    saved = CallbackList([a, b, Recorder([], "x")]).state_dict()
    assert saved == {"Counter#1": {"n": 3}, "Counter#2": {"n": 5}}      # a callback with no state: nothing
    c, d = Counter(), Counter()
    assert CallbackList([c, d]).load_state_dict(saved) == [] and (c.n, d.n) == (3, 5)
    e = Counter()
    e.n = 1
    assert CallbackList([e]).load_state_dict({}) == ["Counter"]          # said to start afresh


def test_an_object_with_no_hook_is_refused():
    with pytest.raises(TypeError, match="callbacks must have at least one of the hooks on_fit_start"):
        CallbackList([object()])
    with pytest.raises(TypeError, match="got int"):
        dptrain.fit(nn.Linear(2, 1), (torch.zeros(8, 2), torch.zeros(8, 1)), loss=nn.MSELoss(), callbacks=[3],
                    log=None, progress=False)
    opt = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    for scheduler in (torch.optim.lr_scheduler.ReduceLROnPlateau(opt), torch.optim.lr_scheduler.StepLR(opt, 2)):
        with pytest.raises(TypeError, match=f"callbacks holds a {type(scheduler).__name__}, a learning-rate "
                                            f"scheduler .Keras's ReduceLROnPlateau is a callback.: pass it as "
                                            f"scheduler="):
            CallbackList([scheduler])


def regression(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    return X, X @ torch.randn(5, 1, generator=g)


@pytest.mark.parametrize("devices", [1, 2])
def test_early_stopping_and_a_logger_as_a_user_writes_them(devices):
    """Stops after epoch 4 (1 + patience 3: the loss must improve by 10, it never does) on 1
    and 2 devices alike; the logger saw the learning rate every 2 batches."""
    torch.manual_seed(0)
    lines = []
    stop, logger = StopWhenFlat(patience=3, min_delta=10.0), LogLearningRate(every=2)
    result = dptrain.fit(nn.Linear(5, 1), regression(), regression(40, 1), loss=nn.MSELoss(), lr=0.05,
                         epochs=9, batch_size=16, devices=devices, callbacks=[stop, logger], log=lines.append,
                         progress=False)
    assert len(result["history"]) == 4 and stop.seen == [1, 2, 3, 4] and stop.wait == 3
    assert "stopped after epoch 4: test loss not better for 3 epochs" in lines
    assert [s for s, _ in logger.logged] == list(range(2, 4 * 6 + 1, 2))     # 6 batches an epoch
    assert "step 24: lr 0.05" in lines


def test_a_stop_asked_mid_epoch_ends_that_epoch_evaluated_and_saved(tmp_path):
    class StopAt(dptrain.Callback):
        def on_batch_end(self, run, batch):
            if (batch.epoch, batch.batch) == (2, 3):
                run.stop("enough")
    torch.manual_seed(0)
    result = dptrain.fit(nn.Linear(5, 1), regression(), regression(40, 1), loss=nn.MSELoss(), lr=0.05, epochs=5,
                         batch_size=16, devices=2, callbacks=[StopAt()], log=None, progress=False,
                         checkpoint_dir=str(tmp_path))
    assert [r["epoch"] for r in result["history"]] == [1, 2] and "test_loss" in result["history"][-1]
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert state["epoch"] == 3 and state["batch"] == 0          # epoch 2 (3 of its 6 batches) was the last


def test_the_run_a_callback_sees():
    seen = {}

    class Look(dptrain.Callback):
        def on_fit_start(self, run):
            seen.update(rank=run.rank, world=run.world_size, main=run.is_main, epochs=run.epochs,
                        batches=run.batches, model=run.model, devices=len(run.devices))

        def on_evaluate_end(self, run, epoch, metrics):
            seen["metrics"] = sorted(metrics)

        def on_fit_end(self, run, result):
            seen["steps"], seen["history"] = run.step, len(run.history)
    model = nn.Linear(5, 1)
    dptrain.fit(model, regression(), regression(40, 1), loss=nn.MSELoss(), epochs=2, batch_size=16, devices=2,
                callbacks=[Look()], log=None, progress=False)
    assert seen == {"rank": 0, "world": 1, "main": True, "epochs": 2, "batches": 6, "model": model, "devices": 2,
                    "metrics": ["test_loss"], "steps": 12, "history": 2}


@pytest.mark.parametrize("with_eval", [True, False])
def test_the_epoch_hooks_come_in_order_and_evaluate_start_only_with_an_evaluation_set(with_eval):
    calls = []

    class Order(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            calls.append(("epoch_start", epoch))

        def on_evaluate_start(self, run, epoch):
            calls.append(("evaluate_start", epoch, run.model.training))

        def on_evaluate_end(self, run, epoch, metrics):
            calls.append(("evaluate_end", epoch))

        def on_epoch_end(self, run, epoch, row):
            calls.append(("epoch_end", epoch))
    dptrain.fit(nn.Linear(5, 1), regression(), regression(40, 1) if with_eval else None, loss=nn.MSELoss(),
                epochs=2, batch_size=16, devices=1, callbacks=[Order()], log=None, progress=False)
    if with_eval:
        assert calls == [("epoch_start", 1), ("evaluate_start", 1, True), ("evaluate_end", 1), ("epoch_end", 1),
                         ("epoch_start", 2), ("evaluate_start", 2, True), ("evaluate_end", 2), ("epoch_end", 2)]
    else:
        assert calls == [("epoch_start", 1), ("epoch_end", 1), ("epoch_start", 2), ("epoch_end", 2)]
