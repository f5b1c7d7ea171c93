"""A loss module's tensors meet each device's outputs on that device: a weighted loss built on
the CPU trains a model on a GPU (and on several), as a script written for any machine builds it.
No GPU here: the ``meta`` device stands for another device (torch refuses the mix alike)."""
import copy
import pickle

import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.loss_placement import LossCopies, summed_twin
from dptrain.engine.losses import LossAdapter

META = torch.device("meta")


class Weighted(nn.Module):
    """A loss of the user's own with a buffer (per-output weights), mean over samples."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.tensor([1.0, 3.0]))

    def forward(self, output, target):
        return ((output - target) ** 2 * self.w).sum(1).mean()


@pytest.mark.parametrize("make", [lambda: nn.BCEWithLogitsLoss(pos_weight=torch.tensor([2.0, 0.5])), Weighted],
                         ids=["pos_weight", "own module"])
def test_a_loss_with_tensors_meets_outputs_on_another_device(make):
    loss = make()
    output, target = torch.zeros(4, 2, device=META), torch.ones(4, 2, device=META)
    with pytest.raises(RuntimeError):       # what the user's loss did before
        loss(output, target)
    adapter = LossAdapter(loss)
    assert adapter(output, target).device == META
    assert adapter.whole(output, target)[0].device == META
    assert all(t.device.type == "cpu" for t in [*loss.parameters(), *loss.buffers()])     # the user's untouched
    cpu_out, cpu_target = torch.zeros(4, 2), torch.ones(4, 2)
    torch.testing.assert_close(adapter.whole(cpu_out, cpu_target)[0], loss(cpu_out, cpu_target))


def test_the_users_loss_is_used_where_its_tensors_are_and_a_copy_is_made_once_elsewhere():
    loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0]))
    summed = nn.CrossEntropyLoss(weight=loss.weight, reduction="sum")
    copies = LossCopies(loss, summed)
    assert copies.on(torch.zeros(2, 2)) == (loss, summed)
    moved, moved_sum = copies.on((torch.zeros(2, 2, device=META), "strings kept"))
    assert moved is not loss and moved.weight.device == META and moved_sum.reduction == "sum"
    assert moved_sum.weight is moved.weight and copies.on(torch.zeros(1, device=META))[0] is moved
    assert not LossCopies.needed(nn.CrossEntropyLoss()) and not LossCopies.needed(torch.nn.functional.mse_loss)
    assert LossAdapter(nn.MSELoss())._placed is None          # nothing to place: no lookup a step


def test_an_optimizer_holding_the_losss_parameters_is_refused_with_the_fix():
    import dptrain

    class Uncertainty(nn.Module):       # a learned weighting: parameters of the loss's own
        def __init__(self):
            super().__init__()
            self.log_var = nn.Parameter(torch.zeros(()))

        def forward(self, output, target):
            return nn.functional.cross_entropy(output, target) * torch.exp(-self.log_var) + self.log_var
    model, loss = nn.Linear(4, 3), Uncertainty()
    with pytest.raises(ValueError, match=r"holds parameters of the loss: .*make the loss a submodule of the model"):
        dptrain.fit(model, (torch.randn(8, 4), torch.randint(0, 3, (8,))), loss=loss, epochs=1, log=None,
                    optimizer=torch.optim.Adam([*model.parameters(), *loss.parameters()]), devices="cpu:0")


class Uncertainty(nn.Module):
    """A learned weighting (Kendall et al.): a parameter of the loss's own."""

    def __init__(self):
        super().__init__()
        self.log_var = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, output, target):
        return nn.functional.cross_entropy(output, target) * torch.exp(-self.log_var) + self.log_var


def test_a_loss_whose_parameters_would_not_train_is_said_with_the_fix_which_trains_them():
    """Given with an optimizer factory, the loss's own parameters trained in no optimizer, unsaid
    (the plain loop's optimizer holds them). The line names them; its fix trains as the plain loop."""
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(64, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (64,), generator=g)
    lines = []
    torch.manual_seed(0)
    dptrain.fit(nn.Linear(4, 3).double(), (X, Y), loss=Uncertainty(), epochs=1, batch_size=16, log=lines.append,
                optimizer=torch.optim.SGD, lr=0.1, devices=1, progress=False)
    assert [line for line in lines if "the loss's parameters" in line] == [
        "dptrain: the loss's parameters log_var require gradients, and fit trains the model's alone: to train them "
        "too, make the loss a submodule of the model (model.criterion = loss) and pass step=lambda model, batch: "
        "model.criterion(model(batch[0]), batch[1]); a network the loss holds frozen: loss.requires_grad_(False) "
        "quiets this line"]
    torch.manual_seed(0)
    plain, criterion = nn.Linear(4, 3).double(), Uncertainty()
    opt = torch.optim.SGD([*plain.parameters(), *criterion.parameters()], lr=0.1)
    for i in range(0, 64, 16):
        opt.zero_grad()
        criterion(plain(X[i:i + 16]), Y[i:i + 16]).backward()
        opt.step()
    for devices in (1, 2):
        torch.manual_seed(0)
        model = nn.Linear(4, 3).double()
        model.criterion = Uncertainty()
        dptrain.fit(model, (X, Y), step=lambda m, batch: m.criterion(m(batch[0]), batch[1]), epochs=1, batch_size=16,
                    optimizer=torch.optim.SGD, lr=0.1, devices=devices, shuffle=False, log=None, progress=False)
        torch.testing.assert_close(model.criterion.log_var, criterion.log_var, rtol=1e-12, atol=1e-12)
    lines.clear()
    for quiet in (Uncertainty().requires_grad_(False), nn.CrossEntropyLoss(weight=torch.ones(3, dtype=torch.float64))):
        dptrain.fit(nn.Linear(4, 3).double(), (X, Y), loss=quiet, epochs=1, batch_size=16, log=lines.append,
                    optimizer=torch.optim.SGD, lr=0.1, devices=1, progress=False)
    assert not [line for line in lines if "the loss's parameters" in line]


def test_a_copy_follows_what_a_callback_edits_in_the_loss():
    """An attribute replaced, a tensor edited in place or replaced: the copy on another device
    is made again before its next use; left alone, it is the same copy."""
    loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0]))
    copies = LossCopies(loss, summed_twin(loss))
    meta = torch.zeros(2, 2, device=META)
    first = copies.on(meta)[0]
    assert copies.on(meta)[0] is first
    loss.label_smoothing = 0.3
    second, second_sum = copies.on(meta)
    assert second is not first and second.label_smoothing == 0.3 and second_sum.label_smoothing == 0.3
    with torch.no_grad():
        loss.weight.mul_(2)                                     # in place: its version moves
    third = copies.on(meta)[0]
    assert third is not second and copies.on(meta)[0] is third
    loss.weight = torch.ones(5)                                 # replaced
    assert copies.on(meta)[0].weight.shape == (5,) and copies.on(torch.zeros(2, 2))[0] is loss


def test_the_summed_twin_is_a_view_of_the_loss_that_sums():
    """Its attributes are the loss's (an edit counts in both), its reduction its own; it pickles
    and deep-copies as the twin of its loss."""
    loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0]))
    twin = summed_twin(loss)
    assert isinstance(twin, nn.CrossEntropyLoss) and type(twin).__name__ == "CrossEntropyLoss"
    assert (twin.reduction, loss.reduction) == ("sum", "mean") and twin.weight is loss.weight
    loss.label_smoothing, loss.ignore_index = 0.2, 1
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 2, 1, 0, 2])
    want = nn.CrossEntropyLoss(weight=loss.weight, label_smoothing=0.2, ignore_index=1, reduction="sum")(x, y)
    torch.testing.assert_close(twin(x, y), want)
    for again in (pickle.loads(pickle.dumps(twin)), copy.deepcopy(twin)):
        assert again.reduction == "sum" and again.label_smoothing == 0.2 and again.weight is not loss.weight
        torch.testing.assert_close(again(x, y), want)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_callbacks_edit_of_the_loss_trains_as_in_the_plain_loop(devices):
    """Label smoothing switched on from epoch 2 by a callback: on 2 devices the shards' summed
    losses took the loss as it was at the start (0.045 from the plain loop's weights)."""
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)

    def smoothing(loss, epoch):
        loss.label_smoothing = 0.0 if epoch == 1 else 0.3

    class Smooth(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            smoothing(loss, epoch)

    torch.manual_seed(0)
    plain, loss = nn.Linear(8, 3), nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5]))
    opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    for epoch in (1, 2, 3):
        smoothing(loss, epoch)
        for i in range(0, 256, 64):
            opt.zero_grad()
            loss(plain(X[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    torch.manual_seed(0)
    model, loss = nn.Linear(8, 3), nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5]))
    dptrain.fit(model, (X, y), epochs=3, batch_size=64, devices=devices, loss=loss, lr=0.5, shuffle=False,
                callbacks=[Smooth()], log=None, progress=False)
    torch.testing.assert_close(model.weight, plain.weight, atol=1e-6, rtol=0)
