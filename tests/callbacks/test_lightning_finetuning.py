"""Lightning's ``BaseFinetuning`` beside a LightningModule (callbacks/lightning_callbacks.py's
``RUN_AS_THEIRS``): its own hooks run with the module's trainer, its ``setup`` freezing the backbone
before the optimizer is made and the model copied to the devices, its ``on_train_epoch_start``
unfreezing it into a group of ``trainer.optimizers``, trained as the plain loop trains it.
Lightning is not installed in CI: ``BaseFinetuning`` here carries its module name and the shape of
its hooks (Lightning 2.6.6's own: the same weights, by benchmarks/lightning_by_hand.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.callbacks.test_lightning_callbacks import LCallback, data
from tests.engine.test_lightning_module import LightningLike


class BaseFinetuning(LCallback):
    """Lightning's BaseFinetuning, its shape: ``setup`` freezes (``freeze_before_training``), each
    epoch's start calls ``finetune_function(pl_module, epoch, optimizer)`` for each of the trainer's
    optimizers, and ``unfreeze_and_add_param_group`` adds the unfrozen layers as a group."""
    __module__ = "lightning.pytorch.callbacks.finetuning"

    def setup(self, trainer, pl_module, stage):
        self.freeze_before_training(pl_module)

    def on_train_epoch_start(self, trainer, pl_module):
        for optimizer in trainer.optimizers:
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)

    @staticmethod
    def unfreeze_and_add_param_group(modules, optimizer, lr):
        modules.requires_grad_(True)
        optimizer.add_param_group({"params": list(modules.parameters()), "lr": lr})


class UnfreezeAt(BaseFinetuning):
    """One's own, as Lightning's docs write it: the backbone frozen, unfrozen at epoch 1 at a tenth
    of the head's rate, that rate doubled at each later epoch (BackboneFinetuning's habit); its rate
    kept in its state."""
    __module__ = "tests.mine"

    def __init__(self):
        self.backbone_lr = None

    def freeze_before_training(self, pl_module):
        pl_module.backbone.requires_grad_(False)

    def finetune_function(self, pl_module, epoch, optimizer):
        if epoch == 1:
            self.backbone_lr = optimizer.param_groups[0]["lr"] / 10
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, self.backbone_lr)
        elif epoch > 1:
            self.backbone_lr *= 2
            optimizer.param_groups[-1]["lr"] = self.backbone_lr

    def state_dict(self):
        return {"backbone_lr": self.backbone_lr}

    def load_state_dict(self, state):
        self.backbone_lr = state["backbone_lr"]


class Tuned(LightningLike):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.Tanh()).double()
        self.head = nn.Linear(8, 2).double()

    def forward(self, x):
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):        # (Lightning's docs: the parameters that train when it is called)
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.5, momentum=0.9)


def by_hand(epochs=3):
    """The plain loop of the same program: the head alone, then the backbone in a group of its own."""
    model = Tuned()
    X, y = data()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.5, momentum=0.9)
    for epoch in range(epochs):
        if epoch == 1:
            opt.add_param_group({"params": list(model.backbone.parameters()), "lr": 0.05})
        elif epoch > 1:
            opt.param_groups[-1]["lr"] *= 2
        for i in range(0, len(X), 16):
            opt.zero_grad()
            F.cross_entropy(model(X[i:i + 16]), y[i:i + 16]).backward()
            opt.step()
    return model


def assert_same_weights(a, b):
    torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in a.parameters()]),
                               torch.cat([p.detach().reshape(-1) for p in b.parameters()]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("devices", [1, 2])
def test_a_finetuning_callback_trains_as_the_plain_loop(devices):
    model, lines = Tuned(), []
    dptrain.fit(model, data(), epochs=3, batch_size=16, shuffle=False, devices=devices, callbacks=[UnfreezeAt()],
                log=lines.append, progress=False)
    assert_same_weights(model, by_hand())
    assert any("callback UnfreezeAt (a Lightning Callback) runs with the module's trainer" in line for line in lines)


def test_a_finetuning_callbacks_run_resumed_ends_as_the_unbroken_one(tmp_path):
    """Stopped after the unfreezing, resumed: its group and its state (the backbone's rate) go on."""
    settings = dict(batch_size=16, shuffle=False, devices=2, log=None, progress=False, checkpoint_dir=str(tmp_path))
    dptrain.fit(Tuned(), data(), epochs=2, callbacks=[UnfreezeAt()], **settings)
    model, callback = Tuned(), UnfreezeAt()
    dptrain.fit(model, data(), epochs=3, callbacks=[callback], resume=True, **settings)
    assert callback.backbone_lr == pytest.approx(0.1)
    assert_same_weights(model, by_hand())
