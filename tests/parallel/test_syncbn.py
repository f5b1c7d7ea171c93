import threading

import pytest
import torch
from torch import nn

import dptrain
from dptrain.parallel.syncbn import SyncBatchNorm, ThreadGroup, convert_sync_batchnorm, synchronized


@pytest.mark.parametrize("n_devices", [2, 3])
def test_statistics_and_gradients_cover_the_whole_batch(n_devices):
    torch.manual_seed(0)
    X = torch.randn(12, 5, 4, 4, dtype=torch.float64) * 3 + 1
    ref = nn.BatchNorm2d(5).double()
    nn.init.normal_(ref.weight)
    Xr = X.clone().requires_grad_()
    (ref(Xr) * torch.arange(5.0, dtype=torch.float64).view(1, 5, 1, 1)).pow(2).sum().backward()

    mods = [nn.BatchNorm2d(5).double() for _ in range(n_devices)]
    for m in mods:
        m.load_state_dict(ref.state_dict() | {"running_mean": torch.zeros(5), "running_var": torch.ones(5),
                                              "num_batches_tracked": torch.tensor(0)})
    holder = [nn.Sequential(m) for m in mods]
    convert_sync_batchnorm(holder)
    assert all(isinstance(h[0], SyncBatchNorm) for h in holder)
    shards = [s.clone().requires_grad_() for s in dptrain.split_and_load(X, [dptrain.cpu(i) for i in range(n_devices)], even_split=False)]
    runner = dptrain.get_runner([dptrain.cpu(i) for i in range(n_devices)])

    def work(i, x):
        with synchronized():
            (holder[i](x) * torch.arange(5.0, dtype=torch.float64).view(1, 5, 1, 1)).pow(2).sum().backward()
    runner.map(work, shards)
    torch.testing.assert_close(torch.cat([s.grad for s in shards]), Xr.grad)
    torch.testing.assert_close(sum(h[0].weight.grad for h in holder), ref.weight.grad)
    torch.testing.assert_close(sum(h[0].bias.grad for h in holder), ref.bias.grad)
    for h in holder:
        torch.testing.assert_close(h[0].running_mean, ref.running_mean)
        torch.testing.assert_close(h[0].running_var, ref.running_var)


def test_outside_a_step_it_is_plain_batchnorm():
    """The user's own model still runs alone after conversion: no waiting for other devices."""
    bn = nn.BatchNorm2d(3)
    holder = [nn.Sequential(bn), nn.Sequential(nn.BatchNorm2d(3))]
    convert_sync_batchnorm(holder)
    x = torch.randn(4, 3, 2, 2)
    torch.testing.assert_close(holder[0](x), nn.BatchNorm2d(3)(x))


def test_a_device_that_never_arrives_is_an_error_not_a_hang():
    group = ThreadGroup(2, timeout=0.5)
    with pytest.raises(RuntimeError, match="not every device reached this BatchNorm layer"):
        group.all_reduce(0, torch.ones(1))
    # The group recovers for the next, complete, exchange.
    out = [None, None]
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, group.all_reduce(r, torch.ones(1) * (r + 1))))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert [o.item() for o in out] == [3.0, 3.0]


def bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def test_fit_gives_the_model_back_with_its_own_batchnorm_trained_and_picklable():
    """The user's BatchNorm layer, parameters and buffers are the ones trained (an optimizer
    built on the model holds them), and the model ends as it was: plain BatchNorm, which
    ``torch.save`` pickles (a SyncBatchNorm holds its group's locks)."""
    import io
    X = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
    y = (X[:, 0] > 0).long()
    runs = []
    for devices, sync in ((1, False), (2, True)):
        model = bn_net()
        bn, params = model[1], list(model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        dptrain.fit(model, (X, y), epochs=2, batch_size=32, devices=devices, sync_batchnorm=sync, optimizer=opt,
                    shuffle=False, log=None)
        assert type(model[1]) is nn.BatchNorm1d and model[1] is bn and list(model.parameters()) == params
        assert int(bn.num_batches_tracked) == 6 and opt.state[bn.weight]["momentum_buffer"] is not None
        torch.save(model, io.BytesIO())
        runs.append(model.state_dict())
    for key, value in runs[0].items():                    # and 2 synchronised devices train as one
        torch.testing.assert_close(runs[1][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_the_model_mid_run_copies_and_pickles_as_its_plain_batchnorm():
    """A callback's copy of the model mid-run (torch's AveragedModel and timm's ModelEmaV2 deepcopy
    it; a best model kept; torch.save(model)) failed: "cannot pickle '_thread.lock' object".
    Each copy is of the replaced layer, with the weights trained so far; the run goes on."""
    import copy
    import io
    X = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
    y = (X[:, 0] > 0).long()
    seen = []

    class Keep(dptrain.Callback):
        def on_epoch_end(self, run, epoch, row):
            assert isinstance(run.model[1], SyncBatchNorm)
            kept = copy.deepcopy(run.model)
            buffer = io.BytesIO()
            torch.save(run.model, buffer)
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=False)
            for other in (kept, loaded):
                assert type(other[1]) is nn.BatchNorm1d and other[1].training == run.model[1].training
                for key, value in run.model.state_dict().items():
                    torch.testing.assert_close(other.state_dict()[key], value, rtol=0, atol=0, msg=key)
                assert other[1].weight is not run.model[1].weight
            seen.append(kept)
    model = bn_net()
    dptrain.fit(model, (X, y), epochs=2, batch_size=32, devices=2, sync_batchnorm=True, shuffle=False, log=None,
                callbacks=[Keep()])
    assert len(seen) == 2 and type(model[1]) is nn.BatchNorm1d
    assert not torch.equal(seen[0][1].weight, seen[1][1].weight)      # each epoch's, not shared


def test_replicas_close_puts_the_batchnorm_layers_back():
    net = bn_net()
    bn = net[1]
    replicas = dptrain.replicate(net, [dptrain.cpu(0), dptrain.cpu(1)], sync_batchnorm=True)
    assert isinstance(net[1], SyncBatchNorm) and net[1].weight is bn.weight and net[1].running_mean is bn.running_mean
    assert "_replaced" not in "".join(net.state_dict())
    net.eval()
    replicas.close()
    assert net[1] is bn and not bn.training


class FailsOnAMark(nn.Module):
    """Linear, BatchNorm, Linear; a sample marked 100 in its first feature is the user's bug."""

    def __init__(self):
        super().__init__()
        self.a, self.bn, self.b = nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x)
        if bool((x[:, 0] == 100.0).any()):
            raise KeyError("the user's own bug")
        return self.b(self.bn(h))


def test_a_device_failing_before_its_batchnorm_raises_its_own_error():
    """The other device stops waiting in its BatchNorm layer at once (it waited for the
    exchange's timeout, and raised the timeout's error instead of the user's)."""
    X = torch.randn(24, 4)
    X[12, 0] = 100.0                    # the second device's part
    with pytest.raises(KeyError, match="the user's own bug"):
        dptrain.fit(FailsOnAMark(), (X, torch.randint(0, 2, (24,))), eval_data=None, epochs=1, batch_size=24,
                    devices=2, sync_batchnorm=True, log=None, shuffle=False, optimizer="sgd")
