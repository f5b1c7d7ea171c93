"""--balance: unequal parts train as one device does on the whole batch; auto follows speed;
--trace writes a valid Chrome trace with a track per device."""
import json
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st
from torch import nn

import dptrain
from dptrain.core.parts import weighted_parts
from dptrain.engine.balance import Balancer, parse_balance
from dptrain.distributed.collective import Collective


@given(st.integers(0, 500), st.lists(st.floats(0, 100), min_size=1, max_size=6).filter(lambda w: sum(w) > 0.01),
       st.sampled_from([0, 1]))
def test_cut_gives_every_sample_once_in_proportion(n, weights, least):
    sizes = weighted_parts(n, weights, least)
    assert sum(sizes) == n and len(sizes) == len(weights) and min(sizes) >= 0
    if n >= least * len(weights):
        assert min(sizes) >= least
    spare = n - (least * len(weights) if n >= least * len(weights) else 0)
    for s, w in zip(sizes, weights):          # within one sample of the exact share
        floor = least if n >= least * len(weights) else 0
        assert abs((s - floor) - spare * w / sum(weights)) < 1 + 1e-9


@given(st.integers(0, 60), st.lists(st.floats(0, 100), min_size=1, max_size=5).filter(lambda w: sum(w) > 0.01),
       st.sampled_from(["fixed", "auto"]))
def test_with_batchnorm_no_part_holds_one_sample_of_a_larger_batch(n, weights, mode):
    """A model with BatchNorm cannot train on one sample: its part goes to the largest one."""
    b = Balancer(weights if mode == "fixed" else "auto", [len(weights)])
    b.least_part = 2
    sizes = b.sizes(0, n)
    assert sum(sizes) == n and len(sizes) == len(weights)
    assert n < 2 or 1 not in sizes
    skewed = Balancer([9.0, 1.0], [2])
    assert skewed.sizes(0, 10) == [9, 1]
    skewed.least_part = 2
    assert skewed.sizes(0, 10) == [10, 0] and skewed.sizes(0, 20) == [18, 2]


def test_weights_and_modes_are_read_or_refused():
    assert parse_balance("3,1") == [3.0, 1.0] and parse_balance("AUTO") == "auto"
    for bad in ("fast", "1,-1", "0,0", "1,inf"):
        with pytest.raises(ValueError, match="--balance"):
            parse_balance(bad)
    with pytest.raises(ValueError, match="gives 3 weights for 2 devices"):
        Balancer("1,2,3", [1, 1])


def test_auto_follows_the_measured_speed_a_few_steps_later():
    b = Balancer("auto", [2], every=8, lag=2)
    assert b.sizes(0, 100) == [50, 50]
    shared = []
    for step in range(8):
        if b.measuring(step):
            b.observe([0.1, 0.4] if step < 4 else [0.1, 0.1], [50, 50])   # device 1: 4x slower, then as fast
        shared.append(b.after_step(step, Collective()))
    assert shared == [False, False, True, False, False, False, False, True]   # a first guess, then every 8
    assert b.sizes(4, 100) == [50, 50]
    assert b.sizes(5, 100) == [79, 21]          # from step 2 + 1 + lag: a sample each kept aside (to keep
                                                # measuring), 98 as 4:1
    # Steps 3-7: 1 of 5 at 4x slower: speeds 500 and 312.5 a second, smoothed with the first guess's 500 and 125.
    assert b.sizes(10, 100) == weighted_parts(100, [500, (125 + 312.5) / 2], least=1) == [69, 31]
    state = b.state_dict()
    again = Balancer("auto", [2], every=8, lag=2)
    assert again.load_state_dict(state) is None and again.sizes(10, 100) == [69, 31]
    assert "cut evenly again" in Balancer("auto", [1, 1]).load_state_dict(state)
    # The first step warms up, unmeasured; on GPUs, where timing a step waits for the device,
    # the steps of the first guess and the last 3 of every 10 are timed.
    assert [s for s in range(20) if Balancer("auto", [2], gpu=True).measuring(s)] == [1, 2, 7, 8, 9, 17, 18, 19]
    assert [s for s in range(20) if Balancer("auto", [2]).measuring(s)] == list(range(1, 20))


def fit(devices, balance, step=None, epochs=2, batch_size=32, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 3))
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(90, 6, generator=g), torch.randint(0, 3, (90,), generator=g)
    kw.setdefault("log", None)
    result = dptrain.fit(model, (X, y), step=step, optimizer="sgd", optimizer_params={"momentum": 0.9}, lr=0.1,
                         batch_size=batch_size, epochs=epochs, devices=devices, balance=balance, **kw)
    return model, result


@pytest.mark.parametrize("devices, balance", [(2, "3,1"), (3, "1,0,5"), (2, "auto"), (2, "1,31")],
                         ids=["3:1", "a device with none", "auto", "a device with one sample"])
def test_unequal_parts_train_as_one_device(devices, balance):
    one, _ = fit(1, "even")
    many, result = fit(devices, balance)
    for p, q in zip(one.parameters(), many.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    if balance == "1,31":
        assert result["history"][0]["split"] == [1, 31]


def test_a_slow_device_gets_a_smaller_share():
    """A delay of 2 ms a sample injected into device 1's steps: auto moves its samples to device 0."""
    def step(model, batch):
        if threading.current_thread().name.endswith(":1"):
            time.sleep(0.002 * len(batch[0]))
        return F.cross_entropy(model(batch[0]), batch[1])
    _, result = fit(2, "auto", step=step, epochs=3, batch_size=8)        # 12 steps an epoch; rebalanced every 10
    first, last = result["history"][0]["split"], result["history"][-1]["split"]
    assert last[1] < 0.5 * last[0], result["history"]
    assert sum(last) == sum(first) == 8


def test_the_trace_is_chrome_json_with_a_track_per_device(tmp_path):
    path = tmp_path / "trace.json"
    fit(3, "even", trace=str(path), trace_steps=4)
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 for e in spans)
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert [threads[t] for t in range(3)] == ["cpu:0", "cpu:1", "cpu:2"]
    for device in range(3):
        names = {e["name"] for e in spans if e["tid"] == device}
        assert {"forward", "backward", "sum_and_update", "fetch"} <= names, names     # kvstore "device"
    assert sum(e["name"] == "forward" and e["tid"] == 0 for e in spans) == 4
    assert any(e["name"] == "data" for e in spans)
    from dptrain.outputs.plot import plot_timeline
    assert plot_timeline(path, tmp_path / "timeline.png").stat().st_size > 1000


@pytest.mark.parametrize("trace_from, said, traced", [(5, "steps 5-6", 2), (100, "step 6", 1)],
                         ids=["from step 5", "past the end: the last step"])
def test_the_trace_starts_at_the_step_asked(tmp_path, trace_from, said, traced):
    path, lines = tmp_path / "trace.json", []
    fit(2, "even", trace=str(path), trace_steps=2, trace_from=trace_from, log=lines.append)   # 6 steps
    assert any(line.startswith(f"trace of {said} written to {path}") for line in lines), lines
    spans = json.loads(path.read_text())["traceEvents"]
    assert sum(e["name"] == "forward" and e["tid"] == 0 for e in spans) == traced
    with pytest.raises(ValueError, match="trace_from must be a whole number >= 1, got 0"):
        fit(2, "even", trace=str(path), trace_from=0)


def test_a_resumed_run_cuts_its_batches_as_the_unbroken_run(tmp_path, monkeypatch):
    """auto made deterministic (device 1 costs 4x a sample): a run stopped by SIGTERM in epoch 2,
    after a rebalance, and resumed, ends bit-identical to the run never stopped."""
    import signal

    from dptrain.core.errors import Interrupted
    observe = Balancer.observe
    monkeypatch.setattr(Balancer, "observe", lambda self, seconds, samples: observe(
        self, [n * c for n, c in zip(samples, (1e-3, 4e-3))], samples))
    calls = [0]

    def step(model, batch, stop_at=None):
        calls[0] += 1                    # two device threads: stop at about step 17 of 36
        if stop_at is not None and calls[0] == stop_at:
            signal.raise_signal(signal.SIGTERM)
        return F.cross_entropy(model(batch[0]), batch[1])
    unbroken, want = fit(2, "auto", step=step, epochs=3, batch_size=8)
    calls[0] = 0
    with pytest.raises(Interrupted, match="epoch 2"):
        fit(2, "auto", step=lambda m, b: step(m, b, stop_at=34), epochs=3, batch_size=8,
            checkpoint_dir=str(tmp_path))
    resumed, got = fit(2, "auto", step=step, epochs=3, batch_size=8, checkpoint_dir=str(tmp_path), resume=True)
    assert [h["split"] for h in got["history"]] == [h["split"] for h in want["history"]] != [[4, 4]] * 3
    for p, q in zip(unbroken.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
