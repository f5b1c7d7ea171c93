"""What only a GPU can show: run by ``bash benchmarks/gpu_suite.sh`` (``pytest -m cuda``), skipped
on machines without CUDA."""
import functools

import pytest
import torch
from torch import nn

import dptrain
from dptrain.data import TensorLoader
from dptrain.engine.model_engine import ModelEngine
from dptrain.models import GluonLeNet, resnet18
from dptrain.engine.task import Task

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def regression(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    return X, X[:, :2] * 3 + 1


def fit_mlp(devices):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2))
    dptrain.fit(model, regression(), loss=nn.MSELoss(), optimizer=functools.partial(torch.optim.SGD, lr=0.05),
                epochs=2, batch_size=16, devices=devices, log=None)
    return [p.detach().cpu() for p in model.parameters()]


def test_devices_are_the_gpus():
    devices = dptrain.parse_devices("auto")
    assert devices and all(d.type == "cuda" for d in devices)
    assert dptrain.try_gpu(0) == torch.device("cuda", 0)


@pytest.mark.parametrize("devices", ["cuda:0", "cuda:0,cuda:0"])
def test_a_gpu_and_two_replicas_of_it_train_as_the_cpu_does(devices):
    for p, q in zip(fit_mlp(devices), fit_mlp("cpu:0")):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kvstore", ["device", "local", "naive"])
def test_replicas_on_one_gpu_sum_like_one_device(kvstore):
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand(12, 1, 28, 28, generator=g), torch.randint(0, 10, (12,), generator=g)) for _ in range(2)]
    params = []
    for devices in (["cuda:0"], ["cuda:0", "cuda:0", "cuda:0"]):
        torch.manual_seed(0)
        engine = ModelEngine(Task(GluonLeNet(), (), optimizer=functools.partial(torch.optim.SGD, lr=0.1)),
                             [torch.device(d) for d in devices], kvstore=kvstore if len(devices) > 1 else None)
        for batch in batches:
            engine.train_batch(batch)
        params.append([p.detach().cpu() for p in engine.replicas[0].parameters()])
    for p, q in zip(*params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_data_held_on_the_gpu_gives_the_host_batches():
    X, y = torch.arange(40, dtype=torch.uint8).view(20, 2), torch.arange(20)
    host = TensorLoader((X, y), 8, shuffle=True, seed=3)
    gpu = TensorLoader((X, y), 8, shuffle=True, seed=3).to(torch.device("cuda", 0))
    for (a, b), (c, d) in zip(host, gpu):
        assert c.is_cuda and c.dtype == torch.uint8
        assert torch.equal(a, c.cpu()) and torch.equal(b, d.cpu())


def test_bf16_channels_last_resnet_trains():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    X, y = torch.rand(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    result = dptrain.fit(resnet18(10, in_channels=1), (X, y), lr=0.05, batch_size=32, epochs=3, devices="cuda:0",
                         amp="bf16", channels_last=True, log=None)
    losses = [h["train_loss"] for h in result["history"]]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_a_nan_loss_stops_on_the_gpu_a_step_later_at_most():
    X, y = regression(256)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="the loss became NaN or infinite at epoch 1, batch"):
        dptrain.fit(nn.Linear(5, 2), (X, y), loss=nn.MSELoss(), lr=1e30, batch_size=16, epochs=1,
                    devices="cuda:0", log=None)


def test_on_the_gpu_the_loss_figures_and_the_nan_batch_are_the_cpu_ones():
    """The GPU's tally (sums on the device, counts in bulk, verdicts read in groups) gives the
    CPU's figures, ignored targets included, and stops at the same batch."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(512, 5, generator=g), torch.randint(0, 3, (512,), generator=g)
    y[::7] = -100

    def run(devices, X=X):
        torch.manual_seed(0)
        result = dptrain.fit(nn.Linear(5, 3), (X, y), lr=0.1, batch_size=16, epochs=2, devices=devices, log=None)
        return [h["train_loss"] for h in result["history"]]
    assert run("cuda:0") == pytest.approx(run("cpu:0"), rel=1e-5)
    broken = X.clone()
    broken[200] = float("nan")
    said = []
    for devices in ("cpu:0", "cuda:0"):
        with pytest.raises(ValueError) as error:
            run(devices, broken)
        said.append(str(error.value))
    assert said[0] == said[1] and "batch" in said[0]


def test_cuda_graphs_train_as_eager():
    def run(compile):
        torch.manual_seed(0)
        model = GluonLeNet()
        g = torch.Generator().manual_seed(3)
        data = (torch.rand(96, 1, 28, 28, generator=g), torch.randint(0, 10, (96,), generator=g))
        dptrain.fit(model, data, lr=0.05, batch_size=32, epochs=2, devices="cuda:0", compile=compile, log=None)
        return [p.detach().cpu() for p in model.parameters()]
    for p, q in zip(run("reduce-overhead"), run(None)):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("devices", ["cuda:0,cuda:0", "cuda:0,cpu:0"])
def test_a_callbacks_weight_edits_reach_every_replica_on_a_gpu(devices):
    """ModelEdits' copies across devices after a hook (default streams: ordered with the steps)."""
    from tests.run.test_callback_edits import MaxNorm, fit, max_norm_, model, plain
    net = model(frozen=False)
    fit(net, devices, 3, [MaxNorm()])
    want = plain(3, after_batch=lambda n: max_norm_(n[2]))
    for p, q in zip(net.parameters(), want.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("devices", ["cuda:0,cuda:0", "cuda:0,cpu:0"])
def test_a_layer_unfrozen_mid_run_on_a_gpu_trains_as_the_plain_loop(devices):
    """Trainer.follow on GPUs: Adam's state carried to the rebuilt optimizers (kvstore
    "device" may move a parameter's owner, and its state, between the GPU and the CPU)."""
    from tests.run.test_unfreezing import fit, model, plain
    net = model(frozen=True)
    fit(net, devices, "adam")
    for p, q in zip(net.parameters(), plain("adam", 3)[0].parameters()):
        torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-4, atol=1e-5)


def test_fp16_on_a_gpu_scales_the_loss_as_a_grad_scaler():
    from tests.engine.test_loss_scale import BATCH, data, model, tiny
    X, y = data(1.0)
    ref = model().cuda()
    opt, scaler = torch.optim.SGD(ref.parameters(), lr=100.0), torch.amp.GradScaler("cuda")
    for _ in range(2):
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = tiny(ref(X[i:i + BATCH].cuda()).float(), y[i:i + BATCH].cuda())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    net = model()
    dptrain.fit(net, (X, y), loss=tiny, optimizer="sgd", lr=100.0, amp="fp16", shuffle=False, epochs=2,
                batch_size=BATCH, devices="cuda:0", log=None)
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("devices", ["cuda:0", "cuda:0,cuda:0", "cuda:0,cpu:0"])
def test_a_weighted_loss_built_on_the_cpu_trains_on_gpus_as_on_the_cpu(devices):
    """``nn.CrossEntropyLoss(weight=w)`` made on the CPU meets each device's outputs on it
    (engine/loss_placement.py): torch refused the mix of devices before."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)

    def run(devs):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
        result = dptrain.fit(model, (X, y), (X, y), loss=nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.0, 3.0])),
                             optimizer=functools.partial(torch.optim.SGD, lr=0.1), epochs=2, batch_size=16,
                             devices=devs, log=None)
        return [p.detach().cpu() for p in model.parameters()], result["history"][-1]["test_loss"]
    (got, got_loss), (want, want_loss) = run(devices), run("cpu:0")
    for p, q in zip(got, want):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert got_loss == pytest.approx(want_loss, rel=1e-4)


@pytest.mark.parametrize("devices", ["cuda:0", "cuda:0,cuda:0", "cuda:0,cpu:0"])
def test_a_callbacks_edit_of_a_loss_built_on_the_cpu_reaches_every_gpu_copy(devices):
    """The class weights doubled for class 2 and label smoothing set from epoch 2 on, by a
    callback, on the loss made on the CPU: each device's copy follows (loss_placement.py)."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)

    class Edit(dptrain.Callback):
        def __init__(self, loss):
            self.loss = loss

        def on_epoch_start(self, run, epoch):
            if epoch == 2:
                with torch.no_grad():
                    self.loss.weight[2] *= 2
                self.loss.label_smoothing = 0.2

    def run(devs):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
        loss = nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.0, 3.0]))
        dptrain.fit(model, (X, y), loss=loss, optimizer=functools.partial(torch.optim.SGD, lr=0.1), epochs=3,
                    batch_size=16, devices=devs, callbacks=[Edit(loss)], log=None)
        return [p.detach().cpu() for p in model.parameters()]
    for p, q in zip(run(devices), run("cpu:0")):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("devices", ["cuda:0", "cuda:0,cuda:0"])
def test_a_lightning_modules_manual_optimization_on_a_gpu_trains_as_the_plain_loop(devices):
    """Manual optimization's copies run at once on GPUs (no turns): two replicas of one GPU
    exchange as two GPUs would (manual_optimization.py)."""
    from tests.engine.test_manual_optimization import GAN, data, flat, plain
    reference = plain(GAN(), *data())
    model = GAN()
    dptrain.fit(model, data(), epochs=2, batch_size=32, devices=devices, shuffle=False, log=None, progress=False)
    torch.testing.assert_close(flat(model).cpu(), flat(reference), rtol=1e-9, atol=1e-9)


def test_the_range_test_on_a_gpu_gives_the_cpus_results():
    from tests.run.test_lr_find import data as points, made
    found = {}
    for devices in ("cpu:0", "cuda:0"):
        model = made()
        found[devices] = dptrain.lr_find(model, points(), loss=nn.MSELoss(), batch_size=32, shuffle=False,
                                         devices=devices, min_lr=1e-4, max_lr=1.0, num_training=30,
                                         early_stop_threshold=None).results
    assert found["cuda:0"]["lr"] == found["cpu:0"]["lr"]
    assert found["cuda:0"]["loss"] == pytest.approx(found["cpu:0"]["loss"], rel=1e-6)
