"""Random draws on several CPU devices of one process (``step_plan.Turns``): a model with
dropout takes them in device order, so runs repeat and resume exactly; a model without
draws keeps its forwards running at once."""
import signal
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.core.errors import Interrupted
from dptrain.engine.step_plan import Turns


class FunctionalDropout(nn.Module):
    """Dropout called as a function inside forward (no Dropout module to find)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 3)

    def forward(self, x):
        return self.b(F.dropout(torch.relu(self.a(x)), 0.3, self.training))


def modules():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))


def data(n=300):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def train(make, devices, **kw):
    torch.manual_seed(0)
    model = make()
    kw.setdefault("log", None)
    result = dptrain.fit(model, data(), epochs=2, batch_size=30, devices=devices,
                         optimizer=torch.optim.Adam, lr=1e-2, **kw)
    return model, result


@pytest.mark.parametrize("make", [modules, FunctionalDropout])
@pytest.mark.parametrize("devices", [2, 3])
def test_dropout_on_virtual_devices_gives_the_same_run_every_time(make, devices):
    first, first_result = train(make, devices)
    for _ in range(3):       # the threads raced for the generator before: runs differed in their last digits
        again, again_result = train(make, devices)
        for p, q in zip(first.parameters(), again.parameters()):
            assert torch.equal(p, q)
        assert [h["train_loss"] for h in again_result["history"]] == [h["train_loss"] for h in first_result["history"]]


def test_dropout_on_virtual_devices_resumes_bit_for_bit(tmp_path):
    whole, _ = train(modules, 2)

    class CtrlC(dptrain.Callback):
        def on_batch_end(self, run, batch):
            if batch.epoch == 1 and batch.batch == 4:
                signal.raise_signal(signal.SIGINT)
    with pytest.raises(Interrupted):
        train(modules, 2, checkpoint_dir=str(tmp_path), callbacks=[CtrlC()])
    resumed, _ = train(modules, 2, checkpoint_dir=str(tmp_path), resume=True)
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def engine_after_a_fit(make, **kw):
    engines = []

    class Keep(dptrain.Callback):
        def on_fit_start(self, run):
            engines.append(run.engine)
    train(make, 2, callbacks=[Keep()], **kw)
    return engines[0]


class Both(FunctionalDropout):
    """A Dropout module and a functional draw."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return super().forward(self.drop(x))


@pytest.mark.parametrize("devices", [2, 3])
def test_a_model_with_both_kinds_of_draws_repeats_too(devices):
    first, _ = train(Both, devices)
    again, _ = train(Both, devices)
    for p, q in zip(first.parameters(), again.parameters()):
        assert torch.equal(p, q)


def test_dropout_layers_draw_from_their_devices_streams_and_only_other_draws_take_turns():
    engine = engine_after_a_fit(modules)
    assert engine.random.draws is False and len(engine.random.streams.wrapped) == 0    # given back after fit
    assert engine_after_a_fit(FunctionalDropout).random.draws is True
    assert engine_after_a_fit(Both).random.draws is True
    no_draws = lambda: nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))    # noqa: E731
    assert engine_after_a_fit(no_draws).random.draws is False
    assert engine_after_a_fit(no_draws, accumulate_grad_batches=2).random.draws is False


def test_draws_outside_dropout_layers_are_said_once():
    lines = []
    train(FunctionalDropout, 2, log=lines.append)
    said = [line for line in lines if "draws random numbers outside nn.Dropout layers" in line]
    assert len(said) == 1 and "on 2 CPU devices their forward passes run one after another" in said[0]
    lines.clear()
    train(modules, 2, log=lines.append)
    assert not any("outside nn.Dropout" in line for line in lines)


def test_the_model_is_given_back_without_our_wrappers_and_its_masks_are_the_plain_ones():
    torch.manual_seed(0)
    model = modules()
    dptrain.fit(model, data(), epochs=1, batch_size=30, devices=2, log=None)
    assert all("forward" not in vars(m) for m in model.modules())
    torch.manual_seed(3)
    out = model(torch.ones(4, 8))
    torch.manual_seed(3)
    assert torch.equal(out, model(torch.ones(4, 8)))


def test_the_streams_differ_by_device_and_process():
    from dptrain.engine.device_streams import stream_seed
    seeds = {stream_seed(0, r, d) for r in range(3) for d in range(3)} | {stream_seed(1, 0, 0)}
    assert len(seeds) == 10


def test_turns_run_in_device_order_and_say_whether_the_generator_moved():
    said = []
    turns = Turns(3, said.append)
    order = []

    def device(i):
        turns.wait(i)
        order.append(i)
        if i == 1:
            torch.rand(1)
        turns.pass_on(i)
    threads = [threading.Thread(target=device, args=(i,)) for i in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert order == [0, 1, 2] and said == [True]
    quiet = Turns(1, said.append)
    quiet.wait(0)
    quiet.pass_on(0)
    assert said == [True, False]
