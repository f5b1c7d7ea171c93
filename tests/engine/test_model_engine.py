"""N virtual devices take, step by step, the steps one device takes on the whole global batch,
for any model, loss (any reduction), batch structure, optimizer and schedule."""
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from dptrain.engine.model_engine import ModelEngine
from dptrain.engine.task import Task


class TwoInputs(nn.Module):
    """A model fed dict batches: ``model(image=..., extra=...)``."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.head = nn.Linear(4 * 6 * 6 + 2, 3)

    def forward(self, image, extra):
        return self.head(torch.cat([F.relu(self.conv(image)).flatten(1), extra], dim=1))


def mlp():
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def data(kind, n, g):
    if kind == "regression":
        X = torch.randn(n, 5, generator=g)
        return (X, X[:, :2] * 3 + 1)
    if kind == "classification":
        return (torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g))
    return {"image": torch.randn(n, 1, 8, 8, generator=g), "extra": torch.randn(n, 2, generator=g),
            "label": torch.randint(0, 3, (n,), generator=g)}


CASES = {
    "mlp + mse": (mlp, "regression", nn.MSELoss()),
    "mlp + sum of l1": (mlp, "regression", nn.L1Loss(reduction="sum")),
    "cnn + cross-entropy": (cnn, "classification", nn.CrossEntropyLoss()),
    "dict batches": (TwoInputs, "dict", nn.CrossEntropyLoss(label_smoothing=0.1)),
}


def plain_steps(make, batches, loss, optimizer, scheduler):
    """What one device does, written the plain PyTorch way."""
    torch.manual_seed(0)
    net = make()
    opt = optimizer(net.parameters())
    sched = scheduler(opt)
    snapshots = []
    for batch in batches:
        opt.zero_grad()
        if isinstance(batch, dict):
            out, y = net(batch["image"], batch["extra"]), batch["label"]
        else:
            out, y = net(batch[0]), batch[1]
        loss(out, y).backward()
        opt.step()
        sched.step()
        snapshots.append([p.detach().clone() for p in net.parameters()])
    return snapshots


OPTIMIZERS = {   # SGD sees a wrongly scaled gradient; Adam would not (it is scale-invariant)
    "sgd": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
    "adamw": functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.05),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("n_devices", [2, 3])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_n_devices_equal_plain_pytorch_on_one_step_by_step(name, n_devices, opt):
    make, kind, loss = CASES[name]
    g = torch.Generator().manual_seed(1)
    batches = [data(kind, n, g) for n in (12, 12, 7)]       # a last, uneven batch
    optimizer = OPTIMIZERS[opt]
    scheduler = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    want = plain_steps(make, batches, loss, optimizer, scheduler)
    torch.manual_seed(0)
    engine = ModelEngine(Task(make(), (), loss=loss, optimizer=optimizer),
                         [dptrain.cpu(i) for i in range(n_devices)])
    sched = scheduler(engine.trainer.optimizer)
    for step, batch in enumerate(batches):
        engine.train_batch(batch)
        sched.step()
        for p, q in zip(engine.replicas[0].parameters(), want[step]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        for replica in list(engine.replicas)[1:]:
            for p, q in zip(replica.parameters(), engine.replicas[0].parameters()):
                assert torch.equal(p, q)


def test_a_step_function_and_a_forward_function():
    """A model whose forward needs more than model(x): the same steps through ``step``, or
    through ``forward`` (then metrics work too)."""
    g = torch.Generator().manual_seed(2)
    batches = [data("dict", n, g) for n in (10, 9)]
    loss = nn.CrossEntropyLoss()
    want = plain_steps(TwoInputs, batches, loss, functools.partial(torch.optim.SGD, lr=0.1),
                       lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0))

    def step(model, batch):
        return F.cross_entropy(model(batch["image"], batch["extra"]), batch["label"])

    def forward(model, batch):
        return model(batch["image"], batch["extra"]), batch["label"]
    for how in (dict(step=step), dict(forward=forward, loss=loss),
                dict(step=lambda m, b: (F.cross_entropy(*forward(m, b), reduction="sum"), len(b["label"])))):
        torch.manual_seed(0)
        engine = ModelEngine(Task(TwoInputs(), (), optimizer=functools.partial(torch.optim.SGD, lr=0.1), **how),
                             [dptrain.cpu(0), dptrain.cpu(1)])
        for batch in batches:
            engine.train_batch(batch)
        for p, q in zip(engine.replicas[0].parameters(), want[-1]):
            torch.testing.assert_close(p, q)


def test_frozen_parameters_and_group_learning_rates():
    torch.manual_seed(0)
    net = mlp()
    net[0].bias.requires_grad_(False)
    frozen = net[0].bias.detach().clone()
    head_before = net[2].weight.detach().clone()
    opt = torch.optim.SGD([{"params": [net[0].weight], "lr": 0.0}, {"params": net[2].parameters(), "lr": 0.1}])
    engine = ModelEngine(Task(net, (), loss=nn.MSELoss(), optimizer=opt), [dptrain.cpu(0), dptrain.cpu(1)])
    g = torch.Generator().manual_seed(0)
    w0 = net[0].weight.detach().clone()
    engine.train_batch(data("regression", 8, g))
    assert torch.equal(net[0].bias, frozen)               # frozen: untouched
    assert torch.equal(net[0].weight, w0)                 # its group's lr is 0
    assert not torch.equal(net[2].weight, head_before)    # the other group's is not
    assert [grp["lr"] for grp in engine.trainer.optimizer.param_groups] == [0.0, 0.1]


def test_evaluation_sums_exactly_on_a_set_that_does_not_divide():
    torch.manual_seed(0)
    engine = ModelEngine(Task(cnn(), (), metrics={"mean_label": lambda out, y: (y.sum(), len(y))}),
                         [dptrain.cpu(i) for i in range(3)])
    g = torch.Generator().manual_seed(3)
    X, y = data("classification", 23, g)
    totals = engine.evaluate(dptrain.TensorLoader((X, y), 5))
    net = engine.replicas[0].eval()
    with torch.no_grad():
        out = net(X)
    assert totals["count"].item() == 23 and totals["correct_count"].item() == 23
    assert totals["correct"].item() == (out.argmax(1) == y).sum().item()
    torch.testing.assert_close(totals["loss"].item() / 23, F.cross_entropy(out, y).item())
    assert totals["mean_label"].item() == y.sum().item() and totals["mean_label_count"].item() == 23


@pytest.mark.parametrize("n_devices", [1, 3])
def test_evaluation_counts_weighted_and_ignored_targets_over_batches_of_unequal_sizes(n_devices):
    # the counts of all batches at once (class_count_total), the last batch shorter
    loss = nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.0]), ignore_index=1)
    torch.manual_seed(0)
    engine = ModelEngine(Task(cnn(), (), loss=loss), [dptrain.cpu(i) for i in range(n_devices)])
    g = torch.Generator().manual_seed(6)
    X, y = data("classification", 29, g)      # (the last batch's targets: 2 0 1 0 2)
    totals = engine.evaluate(dptrain.TensorLoader((X, y), 8))
    net = engine.replicas[0].eval()
    with torch.no_grad():
        out = net(X)
    kept = y != 1
    torch.testing.assert_close(totals["count"].item(), loss.weight[y[kept]].sum().item())
    torch.testing.assert_close(totals["loss"].item() / totals["count"].item(), loss(out, y).item())
    assert totals["correct_count"].item() == kept.sum().item()
    assert totals["correct"].item() == ((out.argmax(1) == y) & kept).sum().item()


def test_lazy_modules_are_materialised_by_the_first_sample():
    net = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    engine = ModelEngine(Task(net, (), loss=nn.MSELoss(), optimizer=torch.optim.Adam),
                         [dptrain.cpu(0), dptrain.cpu(1)])
    g = torch.Generator().manual_seed(0)
    batch = data("regression", 6, g)
    engine.prepare(dptrain.TensorLoader(batch, 6).example(), lr=0.01)
    assert engine.trainer.learning_rate == 0.01 and net[0].weight.shape == (4, 5)
    engine.train_batch(batch)
    assert torch.equal(engine.replicas[1][0].weight, net[0].weight)


@pytest.mark.parametrize("sync", [True, False])
def test_sync_batchnorm_makes_n_devices_equal_one(sync):
    """With sync_batchnorm the statistics cover the whole batch (float64: no rounding to hide
    behind); without it each device normalises its own shard, as the reference does."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(108, 3))
        g = torch.Generator().manual_seed(4)
        batches = [(torch.randn(9, 1, 8, 8, generator=g), torch.randint(0, 3, (9,), generator=g)) for _ in range(2)]
        engines = [ModelEngine(Task(make(), (), optimizer=functools.partial(torch.optim.SGD, lr=0.1)),
                               [dptrain.cpu(i) for i in range(n)], sync_batchnorm=sync and n > 1) for n in (1, 3)]
        for engine in engines:
            for batch in batches:
                engine.train_batch(batch)
        one, three = (dict(e.replicas[0].named_parameters()) for e in engines)
        same = all(torch.allclose(one[k], three[k], rtol=1e-9, atol=1e-12) for k in one)
        assert same == sync
    finally:
        torch.set_default_dtype(before)


class Partly(nn.Module):
    """A layer never called, one called every other training step, and one called only for
    shards holding a sample with x[0] > 1.2 (its output is the same as always calling it, but
    a device whose shard has none gets no gradient for it)."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(5, 8), nn.Linear(8, 2)
        self.never, self.sometimes, self.rare = nn.Linear(8, 2), nn.Linear(8, 8), nn.Linear(8, 8)
        self.steps = 0

    def forward(self, x):
        h = torch.tanh(self.body(x))
        if self.training:
            self.steps += 1
            if self.steps % 2 == 0:
                h = h + self.sometimes(h)
        mask = (x[:, :1] > 1.2).float()
        if mask.any():
            h = h + mask * self.rare(h)
        return self.head(h)


@pytest.mark.parametrize("n_devices, kvstore", [(1, None), (2, "device"), (3, "device"), (2, "local"),
                                                (3, "naive"), (2, "ring")])
def test_parameters_a_step_does_not_use_train_as_plain_pytorch(n_devices, kvstore):
    """Never used: never updated (its grad stays None, momentum untouched); used on some
    devices only: the others count zeros; in every case the plain loop's weights."""
    g = torch.Generator().manual_seed(3)
    batches = [data("regression", n, g) for n in (12, 12, 9, 12)]
    optimizer = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
    want = plain_steps(Partly, batches, nn.MSELoss(), optimizer, lambda opt: torch.optim.lr_scheduler.LambdaLR(
        opt, lambda e: 1.0))
    torch.manual_seed(0)
    engine = ModelEngine(Task(Partly(), (), loss=nn.MSELoss(), optimizer=optimizer, kvstore=kvstore),
                         [dptrain.cpu(i) for i in range(n_devices)])
    never = engine.replicas[0].never.weight.detach().clone()
    for step, batch in enumerate(batches):
        engine.train_batch(batch)
        for p, q in zip(engine.replicas[0].parameters(), want[step]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert torch.equal(engine.replicas[0].never.weight, never)


def clipped_plain_steps(make, batches, loss, optimizer, max_norm, max_value=None):
    """One device, the plain way, clipping with torch.nn.utils.clip_grad_norm_ (then
    clip_grad_value_); the norms too (and how many elements the value clip changed)."""
    torch.manual_seed(0)
    net = make()
    opt = optimizer(net.parameters())
    snapshots, norms = [], []
    for X, y in batches:
        opt.zero_grad()
        loss(net(X), y).backward()
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
        if max_value is not None:
            norms.append(sum(int((p.grad.abs() > max_value).sum()) for p in net.parameters()))
            torch.nn.utils.clip_grad_value_(net.parameters(), max_value)
        opt.step()
        snapshots.append([p.detach().clone() for p in net.parameters()])
    return snapshots, norms


@pytest.mark.parametrize("n_devices, kvstore", [(1, None), (2, "device"), (3, "device"), (2, "local"),
                                                (3, "naive"), (2, "ring")])
def test_clipping_uses_the_norm_of_the_whole_summed_gradient(n_devices, kvstore):
    """max_norm 0.1 clips every step here: N devices take the one-device clipped steps."""
    g = torch.Generator().manual_seed(4)
    batches = [data("regression", n, g) for n in (12, 12, 7, 12)]
    optimizer = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    want, norms = clipped_plain_steps(mlp, batches, nn.MSELoss(), optimizer, 0.1)
    assert all(n > 0.1 for n in norms)
    torch.manual_seed(0)
    engine = ModelEngine(Task(mlp(), (), loss=nn.MSELoss(), optimizer=optimizer, kvstore=kvstore),
                         [dptrain.cpu(i) for i in range(n_devices)], clip_grad_norm=0.1)
    for step, batch in enumerate(batches):
        result = engine.train_batch(batch)
        torch.testing.assert_close(float(result.grad_norm), norms[step], rtol=1e-5, atol=1e-6)
        for p, q in zip(engine.replicas[0].parameters(), want[step]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_devices, kvstore", [(1, None), (2, "device"), (3, "device"), (2, "local"),
                                                (3, "naive"), (2, "ring")])
@pytest.mark.parametrize("max_norm", [None, 0.1])
def test_clipping_by_value_clamps_the_summed_gradient_as_one_device_does(n_devices, kvstore, max_norm):
    """clip_grad_value 0.01 (after the norm clip, if any) changes some elements every step:
    N devices take the one-device steps of clip_grad_value_."""
    g = torch.Generator().manual_seed(4)
    batches = [data("regression", n, g) for n in (12, 12, 7, 12)]
    optimizer = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    want, clamped = clipped_plain_steps(mlp, batches, nn.MSELoss(), optimizer, max_norm, 0.01)
    assert all(n > 0 for n in clamped[1::2] if max_norm) and all(n > 0 for n in clamped if not max_norm)
    torch.manual_seed(0)
    engine = ModelEngine(Task(mlp(), (), loss=nn.MSELoss(), optimizer=optimizer, kvstore=kvstore),
                         [dptrain.cpu(i) for i in range(n_devices)], clip_grad_norm=max_norm, clip_grad_value=0.01)
    for step, batch in enumerate(batches):
        engine.train_batch(batch)
        for p, q in zip(engine.replicas[0].parameters(), want[step]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["loss", "acc", "count", "correct", "f1_count"])
def test_a_metric_named_like_dptrains_own_figures_is_refused(name):
    with pytest.raises(ValueError, match=f"metric name '{name}' is taken by dptrain's own figures"):
        Task(model=mlp(), train_data=(torch.zeros(4, 5), torch.zeros(4, 2)), metrics={name: lambda o, t: (0, 1)})


@pytest.mark.parametrize("given", [{"loss": nn.MSELoss()}, {"loss": F.mse_loss}, {"step": lambda m, b: {"loss": F.mse_loss(m(b[0]), b[1]), "logits": m(b[0])}}])
def test_acc_is_the_users_where_dptrain_counts_no_accuracy(given):
    """A step function or a loss not a classifier's gives no accuracy of dptrain's: a metric
    may be called "acc" (then it is test_acc), as Keras names its own; "loss" stays taken."""
    data = (torch.randn(8, 5), torch.randn(8, 2))
    hits = lambda out, y: ((out.argmax(1) == y.argmax(1)).sum(), len(y))     # noqa: E731
    history = dptrain.fit(mlp(), data, data, metrics={"acc": hits}, epochs=1, batch_size=4, devices="cpu:0",
                          log=None, **given)["history"]
    model = mlp()
    assert 0.0 <= history[0]["test_acc"] <= 1.0
    with pytest.raises(ValueError, match="metric name 'loss' is taken by dptrain's own figures \\(test_loss and"):
        Task(model=model, train_data=data, metrics={"loss": hits}, **given)
    for classifier in ({}, {"loss": nn.CrossEntropyLoss()}, {"loss": F.cross_entropy}, {"loss": nn.NLLLoss()}):
        with pytest.raises(ValueError, match="metric name 'acc' is taken by dptrain's own figures \\(test_loss, "
                                             "test_acc"):
            Task(model=model, train_data=data, metrics={"acc": hits}, **classifier)


@pytest.mark.parametrize("n_devices", [2, 3])
def test_a_batchnorm_model_trains_a_batch_too_small_for_every_device_as_the_plain_loop(n_devices):
    """A last batch of 3 on 2 or 3 devices would give a device one sample, which BatchNorm
    refuses to train on: it goes whole to one device, which is the plain loop's step on it."""
    def bn_mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    X, y = torch.randn(3, 5, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 1])
    engine = ModelEngine(Task(bn_mlp(), (), optimizer=functools.partial(torch.optim.SGD, lr=0.1)),
                         [dptrain.cpu(i) for i in range(n_devices)])
    assert engine.least_part == 2 and [s is not None for s in engine._plan((X, y), None).shards] == \
        [True] + [False] * (n_devices - 1)
    engine.train_batch((X, y))
    plain = bn_mlp()
    torch.optim.SGD(plain.parameters(), lr=0.1).zero_grad()
    F.cross_entropy(plain(X), y).backward()
    with torch.no_grad():
        for p in plain.parameters():
            p -= 0.1 * p.grad
    for p, q in zip(engine.replicas[0].parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    assert ModelEngine(Task(mlp(), ()), [dptrain.cpu(0), dptrain.cpu(1)]).least_part == 1
    # synchronised, BatchNorm takes the whole batch's statistics: every part comes, one sample too
    assert ModelEngine(Task(bn_mlp(), ()), [dptrain.cpu(0), dptrain.cpu(1)], sync_batchnorm=True).least_part == 1


def test_a_dict_batch_with_a_key_forward_does_not_take_names_it_and_the_ways_out():
    """A Hugging Face dataset's extra column (the Trainer drops it): the error names the key."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x)
    data = {"x": torch.randn(8, 3), "idx": torch.arange(8), "labels": torch.randint(0, 2, (8,))}
    with pytest.raises(TypeError, match=r"its keys must be the arguments of Net.forward .*'idx'.*; rename them, leave "
                                        r"the others out in collate_fn .*or pass forward="):
        dptrain.fit(Net(), data, epochs=1, batch_size=4, devices=1, log=None)
