"""A LightningModule's hooks of each update (``callbacks/lightning_batch_hooks.py``):
``on_after_backward`` and ``on_before_optimizer_step`` see in ``p.grad`` the plain loop's
gradient before clipping, on 1-3 devices and 2 processes; ``on_before_zero_grad`` runs on the
weights Lightning's does; what the batch hooks ``self.log`` is in the step rows (Lightning's
``on_step``) or the epoch's mean (``on_epoch=True``, kept across a resume); and what they cannot
do is an error naming the way."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.distributed.helpers import run_workers
from tests.engine.test_lightning_module import LightningLike

N, BATCH, EPOCHS = 96, 16, 2


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, 6, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 1).long()


def norms(module):
    """Lightning's ``grad_norm(module, norm_type=2)``, by hand: each gradient's norm and the total."""
    each = {f"grad_2.0_norm/{n}": p.grad.norm() for n, p in module.named_parameters() if p.grad is not None}
    return {**each, "grad_2.0_norm_total": torch.stack(list(each.values())).norm()}


class Watching(LightningLike):
    """Reads and logs the gradients where Lightning's documentation does; an EMA of the weights
    in ``on_before_zero_grad`` (some diffusion codebases' place for it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        self.ema = [p.detach().clone() for p in self.net.parameters()]
        self.seen, self.lrs = [], []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)

    def on_after_backward(self):
        self.seen.append(("after_backward", self.global_step, {n: p.grad.clone() for n, p in self.named_parameters()}))

    def on_before_optimizer_step(self, optimizer):
        self.seen.append(("before_step", self.global_step, {n: p.grad.clone() for n, p in self.named_parameters()}))
        self.lrs.append(optimizer.param_groups[0]["lr"])
        self.log_dict(norms(self))
        self.log("first_weight", self.net[0].weight.grad[0, 0], on_epoch=True)

    def on_before_zero_grad(self, optimizer):
        with torch.no_grad():
            for e, p in zip(self.ema, self.net.parameters()):
                e.mul_(0.5).add_(p, alpha=0.5)


def lightning_by_hand(model, clip=None):
    """Lightning's automatic optimization, hook by hook, on the samples in order."""
    X, y = data()
    opt = model.configure_optimizers()
    step, rows = 0, {}
    for _ in range(EPOCHS):
        for i in range(0, N, BATCH):
            model._trainer = type("T", (), {"global_step": step, "current_epoch": 0})()
            loss = model.training_step((X[i:i + BATCH], y[i:i + BATCH]), i // BATCH)
            model.on_before_zero_grad(opt)
            opt.zero_grad()
            loss.backward()
            logged = {}
            model.log_dict = lambda d, **kw: logged.update({k: float(v) for k, v in d.items()})
            model.log = lambda name, value, **kw: logged.update({name + "_step": float(value)})
            model.on_after_backward()
            model.on_before_optimizer_step(opt)
            del model.log_dict, model.log
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            step += 1
            rows[step] = logged
    model._trainer = None
    return rows


def fitted(devices=1, **settings):
    model = Watching()
    result = dptrain.fit(model, data(), epochs=EPOCHS, batch_size=BATCH, shuffle=False, devices=devices, log=None,
                         progress=False, log_every_n_steps=2, **settings)
    return model, result


def assert_same_seen(got, want):
    assert [(hook, step) for hook, step, _ in got] == [(hook, step) for hook, step, _ in want]
    for (_, _, a), (_, _, b) in zip(got, want):
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-12)


@pytest.mark.parametrize("devices, clip", [(1, None), (2, None), (3, 0.3), (2, 0.3)])
def test_the_gradient_hooks_see_the_plain_loops_gradient_before_clipping_and_log_in_the_step_rows(devices, clip):
    expected = Watching()
    rows = lightning_by_hand(expected, clip)
    model, result = fitted(devices, **({"clip_grad_norm": clip} if clip else {}))
    assert_same_seen(model.seen, expected.seen)
    assert model.lrs == [0.2] * len(expected.lrs)
    for a, b in zip(model.state_dict().values(), expected.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(model.ema, expected.ema):          # (on_before_zero_grad: the weights before each step)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    history = result["step_history"]
    assert [row["step"] for row in history] == list(range(2, 13, 2))
    for row in history:
        want = rows[row["step"]]
        assert {k: row[k] for k in want} == pytest.approx(want, rel=1e-12)
    epochs = result["history"]
    firsts = [rows[s]["first_weight_step"] for s in range(1, 13)]
    assert [row["train_first_weight_epoch"] for row in epochs] == pytest.approx(
        [sum(firsts[:6]) / 6, sum(firsts[6:]) / 6], rel=1e-12)
    assert all(not p.grad_fn and p.grad is None for p in model.parameters())     # (p.grad given back)


def test_on_train_batch_end_logs_in_its_own_steps_row_and_runs_once_an_update():
    class Counting(Watching):
        ends = []

        def on_train_batch_end(self, outputs, batch, batch_idx):
            Counting.ends.append(self.global_step)
            self.log("seen_step", float(self.global_step))
    lines = []
    model = Counting()
    result = dptrain.fit(model, data(), epochs=1, batch_size=BATCH, shuffle=False, devices=2, log=lines.append,
                         progress=False, log_every_n_steps=3)
    assert Counting.ends == [1, 2, 3, 4, 5, 6]
    assert [(row["step"], row["seen_step"]) for row in result["step_history"]] == [(3, 3.0), (6, 6.0)]
    steps = [line for line in lines if line.startswith("step ")]
    assert "grad 2.0 norm total" in steps[0] and "seen step 3.000" in steps[0] and "/" not in steps[0]


def test_without_step_rows_a_line_says_where_the_step_figures_would_go():
    lines = []
    result = dptrain.fit(Watching(), data(), epochs=2, batch_size=BATCH, devices=1, log=lines.append, progress=False)
    told = [line for line in lines if "each step (Lightning's on_step)" in line]
    assert len(told) == 1 and "give log_every_n_steps=N" in told[0] and "'grad_2.0_norm/net.0.weight'" in told[0]
    assert "train_first_weight_epoch" in result["history"][-1]
    assert any("on_after_backward and on_before_optimizer_step see each update's whole gradient" in line
               for line in lines)


def test_a_run_resumed_mid_epoch_gives_the_epochs_mean_of_an_unbroken_run(tmp_path):
    _, whole = fitted(1)
    dptrain.fit(Watching(), data(), epochs=EPOCHS, batch_size=BATCH, shuffle=False, devices=1, log=None,
                progress=False, log_every_n_steps=2, max_steps=9, checkpoint_dir=str(tmp_path))
    _, resumed = fitted(1, checkpoint_dir=str(tmp_path), resume=True)
    assert [row["train_first_weight_epoch"] for row in resumed["history"]] == pytest.approx(
        [row["train_first_weight_epoch"] for row in whole["history"]], rel=1e-12)


class BeforeStep(LightningLike):
    """``on_before_optimizer_step`` alone: Lightning calls it once an update, after the
    micro-batches' backwards."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
        self.seen = []

    def forward(self, x):
        return self.net(x)

    training_step = Watching.training_step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)

    def on_before_optimizer_step(self, optimizer):
        self.seen.append({n: p.grad.clone() for n, p in self.named_parameters()})


def test_accumulation_gives_on_before_optimizer_step_the_updates_gradient_and_refuses_the_micro_batch_hooks():
    whole, micro = BeforeStep(), BeforeStep()
    for model, batch, accumulate in ((whole, 2 * BATCH, 1), (micro, BATCH, 2)):
        dptrain.fit(model, data(), epochs=1, batch_size=batch, shuffle=False, devices=2, log=None, progress=False,
                    accumulate_grad_batches=accumulate)
    assert len(micro.seen) == len(whole.seen) == N // (2 * BATCH)
    for a, b in zip(micro.seen, whole.seen):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"the module's on_before_zero_grad and on_after_backward with "
                                         r"accumulate_grad_batches=2: Lightning calls them on every micro-batch"):
        dptrain.fit(Watching(), data(), epochs=1, batch_size=BATCH, devices=1, log=None, accumulate_grad_batches=2)


def test_a_hook_writing_to_a_gradient_is_an_error_naming_the_ways_that_change_one():
    class Scaling(Watching):
        def on_after_backward(self):
            for p in self.parameters():
                p.grad.mul_(0.5)
    with pytest.raises(ValueError, match=r"the module's on_after_backward or on_before_optimizer_step wrote to the "
                                         r"gradient of 'net.0.weight'.*p.register_hook.*clip_grad_norm="):
        dptrain.fit(Scaling(), data(), epochs=1, batch_size=BATCH, devices=1, log=None)


def test_a_metric_object_logged_in_a_batch_hook_is_an_error_naming_training_step():
    torchmetrics = pytest.importorskip("torchmetrics")

    class Metric(Watching):
        def __init__(self):
            super().__init__()
            self.acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)

        def on_before_optimizer_step(self, optimizer):
            self.log("acc", self.acc)
    with pytest.raises(ValueError, match=r"torchmetrics object \('acc'\) in the module's on_before_optimizer_step: "
                                         r"log it in training_step"):
        dptrain.fit(Metric(), data(), epochs=1, batch_size=BATCH, devices=1, log=None)


def two_processes(rank, world, devices):
    model, result = fitted(devices, clip_grad_norm=0.3)
    return [(hook, step, {n: t.tolist() for n, t in grads.items()}) for hook, step, grads in model.seen], \
        result["step_history"]


@pytest.mark.parametrize("devices", [1, 2])
def test_two_processes_give_the_hooks_the_whole_batchs_gradient(devices):
    expected = Watching()
    rows = lightning_by_hand(expected, 0.3)
    (first, history), (second, _) = run_workers(two_processes, devices)
    assert first == second
    assert_same_seen([(h, s, {n: torch.tensor(t, dtype=torch.float64) for n, t in g.items()}) for h, s, g in first],
                     expected.seen)
    assert history[-1]["grad_2.0_norm_total"] == pytest.approx(rows[12]["grad_2.0_norm_total"], rel=1e-12)
