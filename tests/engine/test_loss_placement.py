"""A loss module's tensors meet each device's outputs on that device: a weighted loss built on
the CPU trains a model on a GPU (and on several), as a script written for any machine builds it.
No GPU here: the ``meta`` device stands for another device (torch refuses the mix alike)."""
import pytest
import torch
from torch import nn

from dptrain.engine.loss_placement import LossCopies
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
