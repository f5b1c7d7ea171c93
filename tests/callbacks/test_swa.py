"""Stochastic Weight Averaging trains as torch's swa_utils recipe in the plain loop (AveragedModel,
SWALR, update_bn), on 1-3 devices and 2 processes, through a resume; update_bn for any data
fit takes is torch's update_bn (callbacks/swa.py)."""
import copy

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn as torch_update_bn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import dptrain
from dptrain.callbacks import SWA
from tests.distributed.helpers import run_workers

g = torch.Generator().manual_seed(0)
X = torch.randn(256, 6, generator=g, dtype=torch.float64)
Y = (X[:, :2].sum(1) > 0).long() + (X[:, 2] > 0.5).long()
EPOCHS, START, BATCH = 8, 5, 32        # START: the first averaged epoch, counted from 1


def net(batchnorm=True):
    torch.manual_seed(1)
    middle = nn.BatchNorm1d(16) if batchnorm else nn.Identity()
    return nn.Sequential(nn.Linear(6, 16), middle, nn.ReLU(), nn.Linear(16, 3)).double()


def optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def cosine(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)


def decaying(opt):
    """A scheduler stepped every batch (scheduler_interval="batch")."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.97 ** step)


def plain(strategy="cos", batchnorm=True, epochs=EPOCHS, interval="epoch", make=None):
    """torch's recipe as its documentation writes it; returns the average and each epoch's lr.
    With a scheduler stepped every batch, it steps until the averaged epochs."""
    model = net(batchnorm)
    opt = optimizer(model)
    make = make or (cosine if interval == "epoch" else decaying)
    scheduler, swa_model = make(opt), AveragedModel(model)
    swa_scheduler = SWALR(opt, swa_lr=0.02, anneal_epochs=2, anneal_strategy=strategy)
    loader = DataLoader(TensorDataset(X, Y), batch_size=BATCH, shuffle=False)
    rates = []
    for epoch in range(epochs):
        rates.append(opt.param_groups[0]["lr"])
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if interval == "batch" and epoch < START - 1:
                scheduler.step()
        if epoch >= START - 1:
            swa_model.update_parameters(model)
            swa_scheduler.step()
        elif interval == "epoch":
            scheduler.step()
    torch_update_bn(loader, swa_model)
    return swa_model.module, rates


def fitted(devices, strategy="cos", batchnorm=True, epochs=EPOCHS, swa=None, interval="epoch", **settings):
    model = net(batchnorm)
    swa = swa or SWA(0.02, swa_epoch_start=START, annealing_epochs=2, annealing_strategy=strategy)
    scheduler = cosine if interval == "epoch" else decaying
    result = dptrain.fit(model, (X, Y), (X[:64], Y[:64]), optimizer=optimizer(model), scheduler=scheduler,
                         scheduler_interval=interval, epochs=epochs,
                         batch_size=BATCH, shuffle=False, devices=devices, sync_batchnorm=devices > 1 and batchnorm,
                         callbacks=[swa], log=None, **settings)
    return model, result, swa


def assert_same(model, reference, tolerance):
    for key, value in reference.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(model.state_dict()[key], value, rtol=tolerance, atol=tolerance, msg=key)


@pytest.mark.parametrize("devices, strategy, interval", [(1, "cos", "epoch"), (2, "linear", "epoch"),
                                                       (3, "cos", "epoch"), (2, "cos", "batch")])
def test_it_trains_as_torchs_recipe_and_the_result_scores_the_average(devices, strategy, interval):
    """The weights, their BatchNorm statistics over the training data, each epoch's learning
    rate (the run's scheduler's, every epoch or every batch, then SWALR's: the run's scheduler
    held), and the test figures of the model it ends with, the average."""
    reference, rates = plain(strategy, interval=interval)
    model, result, swa = fitted(devices, strategy, interval=interval)
    assert_same(model, reference, 0 if devices == 1 else 1e-12)
    # A row's lr is what the next update takes: stepped every batch, the next epoch's first
    # before the averaged epochs; from then on, each epoch's (held: SWALR steps at its end).
    expected = rates if interval == "epoch" else rates[1:START] + rates[START - 1:]
    assert result["history"]["lr"] == pytest.approx(expected, rel=1e-12)
    assert swa.averaged == EPOCHS - START + 1 == result["swa_epochs"]
    with torch.no_grad():
        expected = nn.functional.cross_entropy(reference.eval()(X[:64]), Y[:64]).item()
    assert result["test_loss"] == pytest.approx(expected, rel=1e-9)
    assert result["test_loss"] != pytest.approx(result["history"]["test_loss"][-1])     # the trained weights'


def one_cycle(total_steps):
    return lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=total_steps)


def test_a_one_cycle_schedule_needs_only_the_steps_before_the_averaged_epochs():
    """Lightning's StochasticWeightAveraging swaps the scheduler at its start: a OneCycleLR
    counting the updates before it trains (it was refused as too short for the whole run)."""
    before = (START - 1) * len(X) // BATCH
    reference, rates = plain(batchnorm=False, interval="batch", make=one_cycle(before))
    model = net(batchnorm=False)
    swa = SWA(0.02, swa_epoch_start=START, annealing_epochs=2)
    result = dptrain.fit(model, (X, Y), optimizer=optimizer(model), scheduler=one_cycle(before),
                         scheduler_interval="batch", epochs=EPOCHS, batch_size=BATCH, shuffle=False, devices=2,
                         callbacks=[swa], log=None)
    assert_same(model, reference, 1e-12)
    assert result["history"]["lr"][START - 1:] == pytest.approx(rates[START - 1:], rel=1e-12)
    model = net()
    with pytest.raises(ValueError, match=rf"OneCycleLR\(total_steps={before - 1}\) is stepped every update, "
                                         rf"{before} times in this run, .*give it total_steps={before}"):
        dptrain.fit(model, (X, Y), optimizer=optimizer(model), scheduler=one_cycle(before - 1),
                    scheduler_interval="batch", epochs=EPOCHS, batch_size=BATCH, devices=1, log=None,
                    callbacks=[SWA(0.02, swa_epoch_start=START)])


def test_a_resumed_run_ends_as_the_unbroken_one(tmp_path):
    unbroken, _, _ = fitted(2)
    fitted(2, epochs=6, checkpoint_dir=str(tmp_path))          # stopped within the averaged epochs
    resumed, result, swa = fitted(2, checkpoint_dir=str(tmp_path), resume=True)
    assert_same(resumed, unbroken, 0)
    assert swa.averaged == 4


def test_one_object_given_to_two_runs_averages_each_afresh_and_a_resume_goes_on(tmp_path):
    """The second run's optimizer annealed, not the first's, and its average its own; the same
    object through a stop and a resume ends as the unbroken run."""
    swa = SWA(0.02, swa_epoch_start=START, annealing_epochs=2)
    fitted(1, swa=swa)
    again, result, _ = fitted(1, swa=swa)
    assert_same(again, plain()[0], 0)
    assert swa.averaged == EPOCHS - START + 1 == result["swa_epochs"]
    unbroken, _, _ = fitted(2)
    fitted(2, epochs=6, checkpoint_dir=str(tmp_path), swa=swa)
    resumed, _, _ = fitted(2, checkpoint_dir=str(tmp_path), resume=True, swa=swa)
    assert_same(resumed, unbroken, 0)


def test_lightnings_stochastic_weight_averaging_runs_as_swa():
    """Its stand-in keeps what Lightning 2.6's __init__ keeps (the peers are not installed in CI)."""
    cls = type("StochasticWeightAveraging", (), {"__module__": "lightning.pytorch.callbacks.stochastic_weight_avg",
                                                 "on_train_epoch_start": lambda self, trainer, module: None,
                                                 "avg_fn": staticmethod(lambda a, b, n: a)})
    peer = cls()
    peer.__dict__.update(_swa_lrs=0.02, _swa_epoch_start=START, _annealing_epochs=2, _annealing_strategy="cos",
                         _avg_fn=cls.avg_fn, _device=torch.device("cpu"))
    lines = []
    model = net()
    dptrain.fit(model, (X, Y), optimizer=optimizer(model), scheduler=cosine, epochs=EPOCHS, batch_size=BATCH,
                shuffle=False, devices=1, callbacks=[peer], log=lines.append)
    assert_same(model, plain()[0], 0)
    assert any("lightning's StochasticWeightAveraging runs as dptrain.callbacks.SWA(swa_lrs=0.02, swa_epoch_start=5, "
               "annealing_epochs=2) (the weights averaged at each epoch's end" in line for line in lines), lines


def test_a_run_ending_before_the_first_averaged_epoch_keeps_the_trained_model():
    stop = type("Stop", (dptrain.Callback,), {"on_epoch_end": lambda self, run, epoch, row: run.stop("enough")
                                              if epoch == 3 else None})()
    model, lines = net(), []
    dptrain.fit(model, (X, Y), epochs=EPOCHS, batch_size=BATCH, devices=1, log=lines.append,
                callbacks=[SWA(0.02, swa_epoch_start=START), stop])
    assert any("SWA: the run ended before epoch 5, its first averaged" in line for line in lines)


def tied(size=5):
    torch.manual_seed(2)
    embed, head = nn.Embedding(size, 4).double(), nn.Linear(4, size, bias=False).double()
    head.weight = embed.weight
    return nn.Sequential(embed, nn.Flatten(), nn.Linear(4, 4).double(), nn.Tanh(), head)


def test_a_weight_tied_to_two_layers_ends_averaged_under_both_names():
    tokens = torch.randint(0, 5, (64, 1), generator=g)
    seen = []
    keep = type("Keep", (dptrain.Callback,), {"on_epoch_end": lambda self, run, epoch, row: seen.append(
        copy.deepcopy(run.model[0].weight.detach())) if epoch >= 2 else None})()
    model = tied()
    dptrain.fit(model, (tokens, tokens[:, 0]), epochs=3, batch_size=16, devices=2, log=None, optimizer=torch.optim.SGD(
        model.parameters(), lr=0.5), callbacks=[SWA(0.1, swa_epoch_start=2), keep])
    torch.testing.assert_close(model[0].weight, (seen[0] + seen[1]) / 2)
    assert model[4].weight is model[0].weight


def swa_two_processes(rank, world):
    model, result, _ = fitted(2, batchnorm=False)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist(), result["test_loss"]


def test_two_processes_of_two_devices_train_as_torchs_recipe():
    (first, loss), (second, other) = run_workers(swa_two_processes)
    assert first == second and loss == other
    reference, _ = plain(batchnorm=False)
    torch.testing.assert_close(torch.tensor(first, dtype=torch.float64),
                               torch.cat([p.detach().reshape(-1) for p in reference.parameters()]), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("settings, message", [
    (dict(swa_lrs=0), "swa_lrs must be a learning rate > 0"),
    (dict(swa_lrs=[0.1, -1]), "swa_lrs must be a learning rate > 0"),
    (dict(swa_lrs=0.1, swa_epoch_start=0), "swa_epoch_start must be an epoch >= 1"),
    (dict(swa_lrs=0.1, swa_epoch_start=1.5), "or a fraction of the epochs in"),
    (dict(swa_lrs=0.1, annealing_epochs=-1), "annealing_epochs must be a whole number >= 0"),
    (dict(swa_lrs=0.1, annealing_strategy="exp"), "annealing_strategy must be one of"),
])
def test_bad_settings_are_errors_naming_them(settings, message):
    with pytest.raises(ValueError, match=message):
        SWA(**settings)


@pytest.mark.parametrize("swa, message", [
    (SWA(0.1, swa_epoch_start=9), r"starts at epoch 9, after the run's last \(8\): nothing would be averaged"),
    (SWA([0.1, 0.2]), "swa_lrs has 2 rates, the optimizer 1 parameter groups"),
])
def test_settings_the_run_cannot_meet_are_errors_before_it(swa, message):
    with pytest.raises(ValueError, match=message):
        fitted(1, swa=swa)


def test_optimizers_taking_turns_are_an_error_naming_them():
    model = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 3)).double()
    steps = {"first": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
             "second": lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])}
    optimizers = {"first": torch.optim.SGD(model[0].parameters(), lr=0.1),
                  "second": torch.optim.SGD(model[1].parameters(), lr=0.1)}
    with pytest.raises(TypeError, match=r"this run's optimizers take turns \(first, second\)"):
        dptrain.fit(model, (X, Y), step=steps, optimizer=optimizers, epochs=2, batch_size=BATCH, devices=1, log=None,
                    callbacks=[SWA(0.1, swa_epoch_start=1)])


class Rows(Dataset):
    """Dict samples, as a Hugging Face-style dataset gives them."""

    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return {"x": X[i], "labels": Y[i]}


class Keyed(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = net()

    def forward(self, x):
        return self.net(x)


def test_update_bn_is_torchs_for_any_data_and_puts_modes_back():
    reference, ours = net(), net()
    torch_update_bn(DataLoader(TensorDataset(X), batch_size=BATCH), reference)
    keyed = Keyed()
    keyed.load_state_dict({f"net.{k}": v for k, v in ours.state_dict().items()})
    keyed.eval()
    momentum = keyed.net[1].momentum
    assert dptrain.update_bn(keyed, Rows(), batch_size=BATCH) == len(X) // BATCH
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(keyed.state_dict()[f"net.{key}"], value, rtol=0, atol=0, msg=key)
    assert not keyed.training and keyed.net[1].momentum == momentum
    assert dptrain.update_bn(net(batchnorm=False), (X, Y)) == 0     # no BatchNorm: nothing read
