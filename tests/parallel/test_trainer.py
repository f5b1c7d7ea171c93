"""Trainer steps on N devices equal steps on 1 device with the same global batch."""
import copy

import pytest
import torch
from torch import nn

import dptrain
from dptrain.parallel.sync.device import balanced_placement
from dptrain.models import GluonLeNet, resnet18


def batches(n=12, steps=2):
    g = torch.Generator().manual_seed(0)
    return [(torch.rand(n, 1, 28, 28, generator=g, dtype=torch.float64).to(torch.get_default_dtype()),
             torch.randint(0, 10, (n,), generator=g)) for _ in range(steps)]


@pytest.fixture
def float64():
    """Exact arithmetic for deep models: in float32, BatchNorm over 3-sample shards amplifies
    rounding to ~1e-3 after one ResNet step; in float64 N devices match 1 device to 1e-15."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def train(make, n_devices, kvstore="device", optimizer="sgd", params=None, sync_bn=False, steps=2, n=12):
    torch.manual_seed(0)
    devices = [dptrain.cpu(i) for i in range(n_devices)]
    replicas = dptrain.replicate(make(), devices, sync_batchnorm=sync_bn)
    trainer = dptrain.Trainer(replicas, optimizer, params or {"learning_rate": 0.1}, kvstore=kvstore)
    for X, y in batches(n, steps):
        replicas.forward_backward(*dptrain.split_batch(X, y, devices, even_split=False))
        trainer.step(len(X))
    replicas._test_trainer = trainer
    return replicas


def assert_same(a, b, **tol):
    for (name, p), q in zip(a[0].named_parameters(), b[0].parameters()):
        torch.testing.assert_close(p, q, msg=name, **tol)
    for x, y in zip(a[0].buffers(), b[0].buffers()):
        torch.testing.assert_close(x.float(), y.float(), **tol)


def assert_replicas_equal(replicas):
    for m in list(replicas)[1:]:
        for p, q in zip(replicas[0].parameters(), m.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("n_devices", [2, 3])
def test_lenet_n_devices_equal_one(n_devices, kvstore):
    one = train(GluonLeNet, 1, kvstore=None)
    many = train(GluonLeNet, n_devices, kvstore=kvstore)
    assert_same(many, one)
    assert_replicas_equal(many)


@pytest.mark.parametrize("optimizer, params", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}),
    ("nag", {"learning_rate": 0.1, "momentum": 0.9}),
    ("adam", {"learning_rate": 0.01, "beta1": 0.8, "epsilon": 1e-6}),
])
def test_optimizers_n_devices_equal_one(optimizer, params, float64):
    # float64: in float32 Adam turned a last-bit difference of the summed gradient of an element
    # whose second moment is near 0 into 1.4e-5 of its weight on one machine (and not on others)
    one = train(GluonLeNet, 1, kvstore=None, optimizer=optimizer, params=params, steps=3)
    many = train(GluonLeNet, 2, optimizer=optimizer, params=params, steps=3)
    assert_same(many, one)


@pytest.mark.parametrize("n_devices", [2, 3])
def test_resnet18_with_sync_batchnorm_equals_one_device(n_devices, float64):
    make = lambda: resnet18(10, in_channels=1)   # noqa: E731
    one = train(make, 1, kvstore=None, n=6, steps=2)
    many = train(make, n_devices, sync_bn=True, n=6, steps=2)
    assert_same(many, one, rtol=1e-9, atol=1e-12)
    assert_replicas_equal(many)


def test_resnet18_per_device_batchnorm_differs_from_one_device(float64):
    """Without sync_batchnorm each device normalises by its own shard (as the reference does)."""
    make = lambda: resnet18(10, in_channels=1)   # noqa: E731
    one = train(make, 1, kvstore=None, n=6, steps=1)
    many = train(make, 2, n=6, steps=1)
    with pytest.raises(AssertionError):
        assert_same(many, one, rtol=1e-9, atol=1e-12)


def test_one_device_trainer_equals_plain_pytorch():
    torch.manual_seed(0)
    net = GluonLeNet()
    torch.manual_seed(0)
    ref = GluonLeNet()
    trainer = dptrain.Trainer(net, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for X, y in batches(steps=3):
        nn.functional.cross_entropy(net(X), y, reduction="sum").backward()
        trainer.step(len(X))
        opt.zero_grad()
        nn.functional.cross_entropy(ref(X), y).backward()
        opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


def test_from_scratch_parameter_lists():
    params = [torch.ones(3), torch.ones(2)]
    groups = [[p.clone().requires_grad_() for p in params] for _ in range(2)]
    trainer = dptrain.Trainer(groups, "sgd", {"learning_rate": 1.0})
    for i, g in enumerate(groups):
        (g[0].sum() * (i + 1) + g[1].sum()).backward()
    trainer.step(batch_size=3)
    for g in groups:                      # grads 1+2=3 and 1+1=2, divided by 3
        torch.testing.assert_close(g[0].detach(), torch.zeros(3))
        torch.testing.assert_close(g[1].detach(), torch.full((2,), 1 - 2 / 3))


def test_learning_rate_can_change_between_steps():
    p = torch.zeros(1, requires_grad=True)
    trainer = dptrain.Trainer([p], "sgd", {"learning_rate": 1.0}, kvstore=None)
    for lr, expected in ((1.0, -1.0), (0.5, -1.5)):
        trainer.set_learning_rate(lr)
        p.sum().backward()
        trainer.step(1)
        assert p.item() == pytest.approx(expected) and trainer.learning_rate == lr
    with pytest.raises(ValueError, match="learning rate must be a finite number >= 0"):
        trainer.set_learning_rate(-1)


def test_stale_gradients_are_an_error_unless_ignored():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    replicas = dptrain.replicate(net, [dptrain.cpu(0), dptrain.cpu(1)])
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    unused_before = net[1].weight.detach().clone()
    replicas.forward_backward([torch.ones(1, 2)] * 2, [torch.zeros(1, dtype=torch.long)] * 2,
                              loss=lambda out, y: out.sum())
    # The loss used only ... all parameters; now use only the first layer:
    trainer.step(2)
    for m in replicas:
        m[0](torch.ones(1, 2)).sum().backward()
    with pytest.raises(ValueError, match=r"parameter '1.weight' got no gradient on device\(s\) cpu:0, cpu:1 "
                                         r"since the last step.*ignore_stale_grad=True"):
        trainer.step(2)
    trainer.step(2, ignore_stale_grad=True)
    assert not torch.equal(net[1].weight, unused_before)   # moved by the first step only
    after = net[1].weight.detach().clone()
    for m in replicas:
        m[0](torch.ones(1, 2)).sum().backward()
    trainer.step(2, ignore_stale_grad=True)
    torch.testing.assert_close(net[1].weight.detach(), after, rtol=0, atol=0)


@pytest.mark.parametrize("name, params, message", [
    ("sdg", {}, "unknown optimizer 'sdg'; choose one of sgd, nag, adam"),
    ("sgd", {"learning rate": 0.1}, "unknown optimizer_params key.s. 'learning rate' for 'sgd'; valid keys: "
                                    "learning_rate, momentum, wd"),
    ("adam", {"momentum": 0.9}, "valid keys: learning_rate, beta1, beta2, epsilon, wd"),
    ("sgd", {"learning_rate": -1}, "must be a finite number >= 0"),
])
def test_optimizer_errors_list_the_valid_choices(name, params, message):
    with pytest.raises(ValueError, match=message):
        dptrain.Trainer(GluonLeNet(), name, params, kvstore=None)


def test_kvstore_errors():
    replicas = dptrain.replicate(GluonLeNet(), [dptrain.cpu(0), dptrain.cpu(1)])
    with pytest.raises(ValueError, match="kvstore=None cannot sum gradients over 2 devices"):
        dptrain.Trainer(replicas, kvstore=None)
    with pytest.raises(ValueError, match="unknown kvstore 'gpu'"):
        dptrain.Trainer(replicas, kvstore="gpu")
    with pytest.raises(ValueError, match="step needs the batch size"):
        dptrain.Trainer(replicas).step(0)


def test_device_placement_balances_one_huge_parameter():
    sizes = [1000] + [10] * 50 + [7] * 30
    for n in (2, 3, 4):
        owner = balanced_placement(sizes, n)
        load = [sum(s for s, o in zip(sizes, owner) if o == k) for k in range(n)]
        assert max(load) <= sum(sizes) / n + max(sizes)
        assert load[owner[0]] == 1000       # the huge one is alone: nothing piled on top
    # Round-robin would put the huge parameter and half the rest on one device.
    assert balanced_placement([100, 1, 1, 1], 2) == [0, 1, 1, 1]


def test_placement_and_bytes_can_be_inspected():
    net = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 8), nn.Linear(8, 8))
    replicas = dptrain.replicate(net, [dptrain.cpu(0), dptrain.cpu(1)])
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    replicas.forward_backward([torch.arange(3)] * 2, [torch.zeros(3, dtype=torch.long)] * 2,
                              loss=lambda out, y: out.sum())
    trainer.step(6)
    kv = trainer.kvstore
    assert kv.placement[0] == "cpu:0" and set(kv.placement[1:]) == {"cpu:1"}
    assert kv.bytes_per_device == {"cpu:0": 1000 * 64 * 4, "cpu:1": (64 * 8 + 8 + 8 * 8 + 8) * 4}


def test_buffers_follow_device_zero():
    replicas = dptrain.replicate(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), [dptrain.cpu(0), dptrain.cpu(1)])
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    X = torch.randn(8, 4)
    replicas.forward_backward(dptrain.split_and_load(X, replicas.devices), [None, None], loss=lambda o, y: o.sum())
    trainer.step(8)
    torch.testing.assert_close(replicas[1][1].running_mean, replicas[0][1].running_mean, rtol=0, atol=0)


def test_device_store_keeps_one_optimizer_state_per_parameter():
    replicas = train(GluonLeNet, 2, optimizer="sgd", params={"learning_rate": 0.1, "momentum": 0.9})
    trainer_states = [len(opt.state) for opt in replicas._test_trainer._optimizers]
    assert sum(trainer_states) == len(list(replicas[0].parameters()))
    assert all(n > 0 for n in trainer_states)          # both devices own and update some


@pytest.mark.parametrize("kvstore", ["device", "local"])
def test_step_with_equals_forward_backward_then_step(kvstore):
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        replicas = dptrain.replicate(GluonLeNet(), devices)
        trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kvstore)
        for X, y in batches(steps=3):
            Xs, ys = dptrain.split_batch(X, y, devices)
            if fused:
                trainer.step_with(lambda i: replicas.forward_backward_one(i, Xs[i], ys[i]), len(X))
            else:
                replicas.forward_backward(Xs, ys)
                trainer.step(len(X))
        results.append(replicas)
    assert_same(results[0], results[1], rtol=0, atol=0)


def test_step_with_reports_a_failing_device_without_hanging():
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    replicas = dptrain.replicate(GluonLeNet(), devices)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1})
    X, y = batches(steps=1)[0]
    Xs, ys = dptrain.split_batch(X, y, devices)
    trainer.step_with(lambda i: replicas.forward_backward_one(i, Xs[i], ys[i]), len(X))

    def compute(i):
        if i == 1:
            raise RuntimeError("out of memory on cpu:1")
        return replicas.forward_backward_one(i, Xs[i], ys[i])
    with pytest.raises(RuntimeError, match="out of memory on cpu:1"):
        trainer.step_with(compute, len(X))


@pytest.mark.parametrize("kvstore", ["device", "local"])
def test_skip_nonfinite_leaves_every_replica_unchanged(kvstore):
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    replicas = dptrain.replicate(nn.Linear(4, 3), devices)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.5, "momentum": 0.9}, kvstore=kvstore)
    X, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    Xs, ys = dptrain.split_batch(X, y, devices)
    replicas.forward_backward(Xs, ys)
    assert trainer.step(6, skip_nonfinite=True) is True            # finite: an ordinary step
    before = [[p.detach().clone() for p in m.parameters()] for m in replicas]
    Xs[1] = Xs[1].clone()
    Xs[1][0, 2] = float("inf")                                      # one device's gradient breaks
    replicas.forward_backward(Xs, ys)
    assert trainer.step(6, skip_nonfinite=True) is False
    for m, saved in zip(replicas, before):
        assert all(torch.equal(p, q) for p, q in zip(m.parameters(), saved))
        assert all(p.grad is None for p in m.parameters())
    replicas.forward_backward(Xs[:1] + [Xs[0]], ys[:1] + [ys[0]])  # and training goes on
    assert trainer.step(6, skip_nonfinite=True) is True
    assert not torch.equal(replicas[0].weight, before[0][0])


def test_frozen_parameters_stay_frozen_and_are_not_sent():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    net[0].weight.requires_grad_(False)
    frozen = net[0].weight.detach().clone()
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    replicas = dptrain.replicate(net, devices)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.5})
    X, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    for _ in range(2):
        replicas.forward_backward(*dptrain.split_batch(X, y, devices))
        trainer.step(6)
    assert not net[0].weight.requires_grad and not replicas[1][0].weight.requires_grad
    assert torch.equal(net[0].weight, frozen) and torch.equal(replicas[1][0].weight, frozen)
    assert not torch.equal(net[2].weight, replicas[1][2].weight * 0)      # the rest did train
    assert len(trainer._groups[0]) == 3


def test_learning_rate_zero_is_accepted_and_nan_is_refused():
    p = torch.ones(1, requires_grad=True)
    trainer = dptrain.Trainer([p], "sgd", {"learning_rate": 0}, kvstore=None)   # warm-up starts here
    p.sum().backward()
    trainer.step(1)
    assert p.item() == 1.0
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match="learning_rate'\\] must be a finite number >= 0"):
            dptrain.Trainer([torch.ones(1, requires_grad=True)], "sgd", {"learning_rate": bad})
        with pytest.raises(ValueError, match="learning rate must be a finite number >= 0"):
            trainer.set_learning_rate(bad)
    with pytest.raises(ValueError, match="learning rate of parameter group 0 must be a finite number"):
        q = torch.ones(1, requires_grad=True)
        opt = torch.optim.SGD([q], lr=0.1)
        opt.param_groups[0]["lr"] = float("nan")
        dptrain.Trainer([q], opt, kvstore=None)


@pytest.mark.parametrize("n_devices", [1, 2, 3])
def test_torch_optimizers_with_groups_and_a_scheduler_equal_plain_pytorch(n_devices):
    """AdamW with two parameter groups (their own lrs) and a cosine schedule on the Trainer's
    optimizer, over N devices, takes the steps plain PyTorch takes on one."""
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

    def groups(net):
        return [{"params": net[0].parameters(), "lr": 0.05}, {"params": net[2].parameters()}]
    ref, net = make(), make()
    opt = torch.optim.AdamW(groups(ref), lr=0.01, weight_decay=0.1)
    ref_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    devices = [dptrain.cpu(i) for i in range(n_devices)]
    replicas = dptrain.replicate(net, devices)
    trainer = dptrain.Trainer(replicas, torch.optim.AdamW(groups(net), lr=0.01, weight_decay=0.1))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(trainer.optimizer, T_max=4)
    for X, y in batches(n=7, steps=3):
        X = X.view(7, -1)[:, :4]
        opt.zero_grad()
        nn.functional.cross_entropy(ref(X), y % 3).backward()
        opt.step()
        ref_sched.step()
        replicas.forward_backward(*dptrain.split_batch(X, y % 3, devices, even_split=False))
        trainer.step(7)
        sched.step()
    for p, q in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(p, q)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [g["lr"] for g in opt.param_groups]
    state = trainer.state_dict()
    assert state["optimizer"] == "AdamW" and len(state["groups"]) == 2


def test_optimizer_factories_and_classes():
    net = nn.Linear(2, 1)
    assert isinstance(dptrain.Trainer(net, torch.optim.AdamW)._optimizers[0], torch.optim.AdamW)
    from functools import partial
    trainer = dptrain.Trainer(net, partial(torch.optim.SGD, lr=0.3, momentum=0.5))
    assert trainer.learning_rate == 0.3 and trainer._optimizers[0].param_groups[0]["momentum"] == 0.5
    with pytest.raises(ValueError, match="optimizer_params go with an optimizer name"):
        dptrain.Trainer(net, torch.optim.SGD, {"learning_rate": 0.1})
    with pytest.raises(TypeError, match="not a torch.optim.Optimizer"):
        dptrain.Trainer(net, lambda params: 3)
    other = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="not a parameter of the model"):
        dptrain.Trainer(net, torch.optim.SGD(other.parameters(), lr=0.1))


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode_reach_every_device(mode):
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    replicas = dptrain.replicate(net, devices)
    with mode():
        outs = replicas.forward(dptrain.split_and_load(torch.randn(6, 4), devices))
    assert [o.requires_grad for o in outs] == [False, False]
    outs = replicas.forward(dptrain.split_and_load(torch.randn(6, 4), devices))
    assert [o.requires_grad for o in outs] == [True, True]


def test_the_default_loss_refuses_regression_targets():
    net = nn.Linear(3, 1)
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    replicas = dptrain.replicate(net, devices)
    X, y = torch.randn(4, 3), torch.randn(4, 1)
    with pytest.raises(ValueError, match="the default loss is cross-entropy over class indices"):
        replicas.forward_backward(*dptrain.split_batch(X, y, devices))


def test_optimizer_state_moves_between_device_layouts():
    """Saved with Adam on 3 devices (each owner holds its share), loaded on 1, 2 or 3
    devices with any kvstore: the next steps are the ones an unbroken run takes."""
    def make(n, kvstore):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        devices = [dptrain.cpu(i) for i in range(n)]
        replicas = dptrain.replicate(net, devices)
        return net, devices, replicas, dptrain.Trainer(replicas, torch.optim.Adam, kvstore=kvstore)

    def steps(devices, replicas, trainer, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(2):
            X, y = torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)
            replicas.forward_backward(*dptrain.split_batch(X, y, devices))
            trainer.step(6)
    net, *rest = make(3, "device")
    steps(*rest, seed=1)
    saved = copy.deepcopy(rest[2].state_dict())             # (a state_dict holds references, as torch's)
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    steps(*rest, seed=2)                                      # the unbroken run
    for n, kvstore in ((1, None), (2, "local"), (3, "naive"), (2, "device")):
        other, *more = make(n, kvstore)
        for m in more[1]:
            m.load_state_dict(weights)
        more[2].load_state_dict(saved)
        steps(*more, seed=2)
        for k, v in net.state_dict().items():
            torch.testing.assert_close(other.state_dict()[k], v, msg=f"{n} devices, kvstore {kvstore}: {k}")
    with pytest.raises(ValueError, match="the checkpoint's optimizer is 'Adam', this run's 'SGD'"):
        dptrain.Trainer(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), "sgd").load_state_dict(saved)
    with pytest.raises(ValueError, match="parameters of other shapes"):
        dptrain.Trainer(nn.Linear(4, 3), torch.optim.Adam).load_state_dict(saved)


@pytest.mark.parametrize("n_devices", [1, 2])
def test_an_optimizer_object_is_lent_to_the_trainer_and_given_back_by_close(n_devices):
    """Its state goes on in the Trainer (Adam's moments of steps before it, held once) and
    comes back with close(), where a plain loop with it would have left it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    twin = copy.deepcopy(net)
    optimizer, plain = torch.optim.Adam(net.parameters(), lr=0.01), torch.optim.Adam(twin.parameters(), lr=0.01)
    X, y = torch.randn(8, 4), torch.randint(0, 2, (8,))

    def plain_step(model, opt):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    plain_step(net, optimizer)                 # a step of the user's own loop first
    optimizer.zero_grad()
    for _ in range(3):
        plain_step(twin, plain)
    replicas = dptrain.replicate(net, [dptrain.cpu(i) for i in range(n_devices)])
    trainer = dptrain.Trainer(replicas, optimizer)
    assert len(optimizer.state) == 0           # lent
    for _ in range(2):
        replicas.forward_backward(*dptrain.split_batch(X, y, replicas.devices))
        trainer.step(len(X))
    trainer.close()
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(optimizer.state[p]["exp_avg_sq"], plain.state[q]["exp_avg_sq"], rtol=1e-5,
                                   atol=1e-9)
        assert float(optimizer.state[p]["step"]) == 3


def lenet_on_two_devices(kvstore, **settings):
    """A LeNet with its one-device gradient of a batch, and a Trainer of 2 devices (``settings``
    set on it) whose replicas have computed that batch's: ``(reference, replicas, trainer, X)``."""
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    torch.manual_seed(0)
    ref = GluonLeNet()
    X, y = batches(steps=1)[0]
    nn.functional.cross_entropy(ref(X), y).backward()
    replicas = dptrain.replicate(copy.deepcopy(ref), devices)
    trainer = dptrain.Trainer(replicas, "sgd", {"learning_rate": 0.1}, kvstore=kvstore)
    for key, value in settings.items():
        setattr(trainer, key, value)
    replicas.forward_backward(*dptrain.split_batch(X, y, devices))
    return ref, replicas, trainer, X


def nan_on_one_device(replicas):
    """A NaN gradient on device 0, zeros on device 1: a step that skips."""
    for p in replicas[0].parameters():
        p.grad = torch.full_like(p, float("nan"))
    for p in replicas[1].parameters():
        p.grad = torch.zeros_like(p)


@pytest.mark.parametrize("kvstore", ["device", "local", "ring"])
def test_grad_norms_by_parameter_are_the_summed_gradients_norms_by_name(kvstore):
    """``norms_by_parameter``: each parameter's norm of the summed, divided gradient, before
    clipping (what ``clip_grad_norm_`` sees on one device); nothing after a skipped step."""
    ref, replicas, trainer, X = lenet_on_two_devices(kvstore, norms_by_parameter=True)
    want = {name: float(p.grad.norm()) for name, p in ref.named_parameters()}
    trainer.step(len(X), max_norm=0.1)
    got = trainer.grad_norms()
    assert list(got) == list(want) and got == pytest.approx(want, rel=1e-5)
    nan_on_one_device(replicas)
    assert not trainer.step(len(X), skip_nonfinite=True, max_norm=0.1)
    assert trainer.grad_norms() == {}


def test_grad_norms_of_parameter_lists_are_named_by_index():
    params = [torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)]
    trainer = dptrain.Trainer(params, "sgd", {"learning_rate": 1.0}, kvstore=None)
    trainer.norms_by_parameter = True
    (params[0].sum() * 2 + params[1].sum()).backward()
    trainer.step(1, max_norm=float("inf"))
    assert trainer.grad_norms() == pytest.approx({"#0": 2 * 3 ** 0.5, "#1": 2 ** 0.5})
    (params[0].sum() + params[1].sum()).backward()
    trainer.step(1)                             # no max_norm: no norm computed
    assert trainer.grad_norms() == {}


@pytest.mark.parametrize("kvstore", ["device", "local", "ring"])
def test_kept_grads_are_the_summed_divided_gradients_before_clipping_taken_once(kvstore):
    """``keep_grads``: a copy of each parameter's summed gradient divided by the step's
    denominator, before clipping (what ``p.grad`` holds on one device), by name, on the first
    device; taken once; none after a skipped step, nor without ``keep_grads``."""
    ref, replicas, trainer, X = lenet_on_two_devices(kvstore, keep_grads=True)
    trainer.step(len(X), max_norm=0.01)
    got = trainer.take_grads()
    assert list(got) == [name for name, _ in ref.named_parameters()]
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-5, atol=1e-7)
        assert got[name].device.type == "cpu"
    assert trainer.take_grads() == {}
    nan_on_one_device(replicas)
    assert not trainer.step(len(X), skip_nonfinite=True)
    assert trainer.take_grads() == {}
    trainer.keep_grads = False
    replicas.forward_backward(*dptrain.split_batch(*batches(steps=1)[0], trainer.devices))
    trainer.step(len(X))
    assert trainer.take_grads() == {}
