"""The trainer a LightningModule reads while fit trains it (dptrain's stand-in): the epoch and
the updates on every device's copy, ``estimated_stepping_batches`` counted from the training
data, and a ``configure_optimizers`` that reads it called then."""
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import IterableDataset

import dptrain
from dptrain.callbacks import EarlyStopping
from dptrain.engine.lightning_trainer import StrategyStandIn, TrainerStandIn
from tests.engine.test_lightning_module import LightningLike, data


def by_hand(model, opt, scheduler=None, weight=lambda epoch: 1, epochs=2, batch=16):
    """Lightning's automatic optimization by hand, on the samples in order (a loss weighted
    by ``weight(epoch)``; ``scheduler`` stepped every update)."""
    X, y = data()
    for epoch in range(epochs):
        for i in range(0, len(X), batch):
            loss = F.cross_entropy(model(X[i:i + batch]), y[i:i + batch]) * weight(epoch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if scheduler is not None:
                scheduler.step()


def twins(cls):
    """A module of ``cls`` (seeded) and its copy, to train by hand."""
    torch.manual_seed(0)
    model = cls()
    return model, copy.deepcopy(model)


def fit_as_by_hand(model, expected, devices, **settings):
    """``fit`` on ``data()`` in order (2 epochs of batches of 16): the weights must be those
    ``expected`` reached by hand. Its result and the lines it logged."""
    lines = []
    result = dptrain.fit(model, data(), epochs=2, batch_size=16, shuffle=False, devices=devices, log=lines.append,
                         progress=False, **settings)
    for a, b in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b)
    return result, lines


class Cycled(LightningLike):
    """Lightning's OneCycleLR habit: its length is the trainer's estimate of the run's updates."""
    counted = []                                    # (the class's: every device's copy adds to it)

    def __init__(self, fallback=False):
        super().__init__()
        self.net, self.fallback = nn.Linear(6, 3), fallback

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        Cycled.counted.append(self.trainer.estimated_stepping_batches)     # (the trial before training too)
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        total = getattr(self.trainer, "estimated_stepping_batches", 1000) if self.fallback \
            else self.trainer.estimated_stepping_batches
        Cycled.counted.append(("configured", total))
        return {"optimizer": opt, "lr_scheduler": {"interval": "step", "scheduler": torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=0.5, total_steps=total)}}


@pytest.mark.parametrize("devices", [1, 2])
def test_configure_optimizers_reading_the_runs_updates_trains_as_the_plain_loop(devices):
    model, expected = twins(Cycled)
    opt = torch.optim.SGD(expected.parameters(), lr=0.1)
    by_hand(expected, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=12))
    Cycled.counted.clear()
    _, lines = fit_as_by_hand(model, expected, devices)
    assert Cycled.counted == [("configured", 12)] + [12] * (1 + 12 * devices)    # (the trial, every copy's step)
    assert "dptrain: the optimizer is model.configure_optimizers()'s (a LightningModule's), called once the " \
           "training data is loaded" in lines
    assert model._trainer is None


class Counting(Cycled):
    """... which also reads an epoch's batches, in configure_optimizers and in its steps."""

    def training_step(self, batch, batch_idx):
        Cycled.counted.append(self.trainer.num_training_batches)
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        Cycled.counted.append(("batches", self.trainer.num_training_batches))
        return super().configure_optimizers()


@pytest.mark.parametrize("settings, updates, batches", [
    (dict(epochs=3, accumulate_grad_batches=4), 6, 6),     # 6 batches an epoch: 2 updates (the last of 2 batches)
    (dict(epochs=3, max_steps=5), 5, 6),                # the limit, when fewer
    (dict(max_steps=8), 8, 6),                          # epochs as many as it needs
    (dict(epochs=2, max_batches=4), 8, 4),              # Lightning's limit_train_batches
    (dict(epochs=2, drop_last=True, batch_size=20), 8, 4),  # 96 samples: 4 full batches of 20
    (dict(epochs=1, validation_split=0.5), 3, 3),       # 48 samples left to train: 3 batches
])
def test_the_estimate_is_the_runs_updates_and_an_epochs_batches(settings, updates, batches, monkeypatch):
    Cycled.counted.clear()
    model = Counting(fallback=True)     # (getattr's default: never taken, configure_optimizers called once)
    built = []
    loader = dptrain.run.build.training_loader
    monkeypatch.setattr(dptrain.run.build, "training_loader", lambda *a, **k: built.append(1) or loader(*a, **k))
    dptrain.fit(model, data(), **{"batch_size": 16, "devices": 1, "log": None, "progress": False, **settings})
    assert Cycled.counted[:2] == [("batches", batches), ("configured", updates)]
    assert len(built) == 2      # the counts' loader, read for both (it was made for each), and the run's
    assert set(Cycled.counted[2::2]) == {batches} and set(Cycled.counted[3::2]) == {updates}    # (every step)


class Endless(IterableDataset):
    def __iter__(self):
        X, y = data()
        return iter(zip(X, y))


def test_a_stream_without_a_length_needs_max_steps():
    with pytest.raises(ValueError, match=r"configure_optimizers reads self.trainer.estimated_stepping_batches, but "
                                         r"the training data \(Endless\) has no length, so the run's updates are not "
                                         r"known: give max_steps=N"):
        dptrain.fit(Cycled(), Endless(), epochs=1, batch_size=16, devices=1, log=None)
    Cycled.counted.clear()
    dptrain.fit(Counting(), Endless(), max_steps=4, batch_size=16, devices=1, log=None, progress=False)
    assert Cycled.counted[:3] == [("batches", math.inf), ("configured", 4), math.inf]     # (an epoch: read to its end)


def test_the_runs_directory_is_the_checkpoint_directory_else_the_working_one(tmp_path, monkeypatch):
    class Saves(Cycled):
        def on_train_end(self):
            torch.save(self.state_dict(), os.path.join(self.trainer.log_dir, "last.pt"))
            assert self.trainer.default_root_dir == self.trainer.log_dir
    dptrain.fit(Saves(), data(), epochs=1, batch_size=32, devices=1, log=None, checkpoint_dir=str(tmp_path / "run"))
    monkeypatch.chdir(tmp_path)
    dptrain.fit(Saves(), data(), epochs=1, batch_size=32, devices=1, log=None)
    assert os.path.exists(tmp_path / "run" / "last.pt") and os.path.exists(tmp_path / "last.pt")


def test_a_device_count_read_names_what_to_read_instead():
    class Scaled(Cycled):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1 * self.trainer.num_devices)
    with pytest.raises(AttributeError, match=r"model.trainer.num_devices: fit's batch_size is the global batch "
                                             r"\(every device's and process's samples\), so counting steps needs "
                                             r"no device count: an epoch is self.trainer.num_training_batches steps"):
        dptrain.fit(Scaled(), data(), epochs=1, devices=1, log=None)


def test_what_the_stand_in_does_not_hold_names_the_way():
    class Loops(Cycled):
        def training_step(self, batch, batch_idx):
            return self.trainer.fit_loop
    with pytest.raises(AttributeError, match=r"model.trainer.fit_loop: while fit trains a LightningModule, its trainer "
                                             r"is dptrain's stand-in, .* strategy \(all_gather, reduce, barrier, "
                                             r"broadcast\), optimizers, lr_scheduler_configs, "
                                             r"callback_metrics, should_stop, log_dir, num_training_batches and "
                                             r"estimated_stepping_batches, not fit_loop: "
                                             r"read what you need from the run in a dptrain.Callback"):
        dptrain.fit(Loops(), data(), epochs=1, devices=1, log=None)


def test_a_training_step_reads_the_estimate_without_configure_optimizers_reading_it():
    class Reads(Cycled):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    Cycled.counted.clear()
    dptrain.fit(Reads(), data(), epochs=2, batch_size=32, devices=1, log=None, progress=False)
    assert Cycled.counted == [6] * (1 + 6)


class Annealed(LightningLike):
    """A loss weighted by the epoch (KL annealing's shape) and a learning rate from max_epochs,
    read from the module's trainer."""
    seen = []                                       # (the class's: every device's copy adds to it)

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(6, 3)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.training:
            Annealed.seen.append((self.current_epoch, self.global_step, batch_idx))
        return F.cross_entropy(self(batch[0]), batch[1]) * (1 + self.current_epoch)

    def validation_step(self, batch, batch_idx):
        self.log("val_updates", float(self.global_step))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2 / self.trainer.max_epochs)


@pytest.mark.parametrize("devices", [1, 2])
def test_the_modules_trainer_says_the_epoch_and_the_updates_on_every_device(devices):
    model, expected = twins(Annealed)
    by_hand(expected, torch.optim.SGD(expected.parameters(), lr=0.1), weight=lambda epoch: 1 + epoch)
    Annealed.seen.clear()
    result, _ = fit_as_by_hand(model, expected, devices, eval_data=data(32, 1))
    assert sorted(set(Annealed.seen)) == [(e, e * 6 + i, i) for e in range(2) for i in range(6)]
    assert len(Annealed.seen) == 12 * devices                       # (every device's copy read it)
    assert [row["test_updates"] for row in result["history"]] == [6.0, 12.0]       # (evaluating: all done)
    assert model._trainer is None and model.current_epoch == 0      # (the stand-in left with the run)


class Unfrozen(LightningLike):
    """Fine-tuning's habit: the backbone frozen as the run starts, trained from the second epoch
    (Lightning's hooks of the run's course, on the module)."""
    calls = []

    def __init__(self):
        super().__init__()
        self.backbone, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.backbone(x)))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)

    def _called(self, hook):
        Unfrozen.calls.append((hook, self.current_epoch, self.global_step))

    def on_fit_start(self):
        self._called("on_fit_start")
        self.backbone.requires_grad_(False)

    def on_train_start(self):
        self._called("on_train_start")

    def on_train_epoch_start(self):
        self._called("on_train_epoch_start")
        if self.current_epoch == 1:
            self.backbone.requires_grad_(True)

    def on_train_end(self):
        self._called("on_train_end")

    def on_fit_end(self):
        self._called("on_fit_end")


@pytest.mark.parametrize("devices", [1, 2])
def test_the_modules_hooks_of_the_runs_course_are_called_where_lightning_calls_them(devices):
    model, expected = twins(Unfrozen)
    opt = torch.optim.SGD(expected.parameters(), lr=0.2)
    expected.backbone.requires_grad_(False)
    by_hand(expected, opt, epochs=1)
    expected.backbone.requires_grad_(True)
    by_hand(expected, opt, epochs=1)
    Unfrozen.calls.clear()
    _, lines = fit_as_by_hand(model, expected, devices)
    assert Unfrozen.calls == [("on_fit_start", 0, 0), ("on_train_start", 0, 0), ("on_train_epoch_start", 0, 0),
                              ("on_train_epoch_start", 1, 6), ("on_train_end", 2, 12), ("on_fit_end", 2, 12)]
    assert "dptrain: the module's on_fit_start, on_train_start, on_train_epoch_start, on_train_end, on_fit_end " \
           "(Lightning hooks) are called where Lightning's Trainer calls them, once a process, on the module (what " \
           "they change, every device's copy gets; what they log, the epoch's row; a batch's hook, its step's row, " \
           "as Lightning's on_step)" in lines


def test_the_stand_in_holds_the_data_module_and_the_accumulation_and_self_print_prints(capsys):
    class DataModule:                               # (a LightningDataModule's shape)
        num_classes = 3

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=16)

    class Reads(Cycled):
        def configure_optimizers(self):
            Cycled.counted.append((self.trainer.datamodule.num_classes, self.trainer.accumulate_grad_batches))
            if self.trainer.progress_bar_callback is None:        # (Lightning's self.print, on rank 0)
                print("printed")
            return torch.optim.SGD(self.parameters(), lr=0.1)
    Cycled.counted.clear()
    dptrain.fit(Reads(), DataModule(), epochs=1, devices=1, accumulate_grad_batches=2, log=None, progress=False)
    assert Cycled.counted[0] == (3, 2) and "printed" in capsys.readouterr().out


class EpochEnds(LightningLike):
    """Lightning's habit of the epoch's end: the steps keep their outputs in lists, the epoch-end
    hooks log what they make of them and clear them."""
    seen = []

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(6, 3)
        self.losses, self.hits = [], []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch[0]), batch[1])
        self.losses.append(loss.detach())       # (also where fit calls it for a loss alone: dropped there)
        return loss

    def validation_step(self, batch, batch_idx):
        self.hits.append((self(batch[0]).argmax(1) == batch[1]).float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2)

    def on_validation_epoch_end(self):
        EpochEnds.seen.append(("on_validation_epoch_end", self.current_epoch, self.global_step))
        self.log("val_rate", torch.cat(self.hits).mean())
        self.hits.clear()

    def on_train_epoch_end(self):
        EpochEnds.seen.append(("on_train_epoch_end", self.current_epoch, self.global_step))
        self.log("train_step_loss", torch.stack(self.losses).mean())
        self.losses.clear()


@pytest.mark.parametrize("devices", [None, 2])
def test_the_epoch_end_hooks_log_into_the_row_what_they_make_of_the_steps_outputs(devices):
    model, expected = twins(EpochEnds)
    opt = torch.optim.SGD(expected.parameters(), lr=0.2)
    X, y = data()
    Xv, yv = data(32, 1)
    want = []
    for _ in range(2):
        losses = []
        for i in range(0, len(X), 16):
            loss = F.cross_entropy(expected(X[i:i + 16]), y[i:i + 16])
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            rate = (expected(Xv).argmax(1) == yv).float().mean().item()
        want.append((rate, sum(losses) / len(losses)))
    EpochEnds.seen.clear()
    lines = []
    result = dptrain.fit(model, data(), data(32, 1), epochs=2, batch_size=16, shuffle=False, log=lines.append,
                         progress=False, callbacks=[EarlyStopping("val_rate", patience=5, mode="max")],
                         devices=devices)
    assert [(row["test_rate"], row["train_step_loss"]) for row in result["history"]] == [
        pytest.approx(w, rel=1e-5) for w in want]
    assert EpochEnds.seen == [("on_validation_epoch_end", 0, 6), ("on_train_epoch_end", 0, 6),
                              ("on_validation_epoch_end", 1, 12), ("on_train_epoch_end", 1, 12)]


class PlateauOnEnd(EpochEnds):
    """A plateau scheduler on the figure ``on_validation_epoch_end`` logs (Lightning steps it
    after the epoch-end hooks)."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.2)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0,
                                                             threshold=0.05)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_rate"}}


def test_a_plateau_scheduler_decides_on_what_an_epoch_end_hook_logs():
    model, expected = twins(PlateauOnEnd)
    config = expected.configure_optimizers()
    opt, plateau = config["optimizer"], config["lr_scheduler"]["scheduler"]
    Xv, yv = data(32, 1)
    lrs, rates = [], []
    for _ in range(5):
        by_hand(expected, opt, epochs=1)
        lrs.append(opt.param_groups[0]["lr"])
        with torch.no_grad():
            rates.append((expected(Xv).argmax(1) == yv).float().mean().item())
        plateau.step(rates[-1])
    assert len(set(lrs)) > 1            # (the plateau cut the rate: the figure decides)
    result = dptrain.fit(model, data(), (Xv, yv), epochs=5, batch_size=16, shuffle=False, log=None)
    assert [row["lr"] for row in result["history"]] == pytest.approx(lrs)
    assert [row["test_rate"] for row in result["history"]] == pytest.approx(rates, rel=1e-5)
    for a, b in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b)



class Gathering(EpochEnds):
    """Lightning's DDP habit for a figure over the whole set: the epoch-end hook gathers every
    process's kept outputs (``self.all_gather``) and asks the strategy for a sum."""

    def on_validation_epoch_end(self):
        hits = self.all_gather(torch.cat(self.hits))            # (world_size, n) on several processes
        strategy = self.trainer.strategy
        strategy.barrier()
        self.log("val_rate", hits.float().mean())
        self.log("val_seen", strategy.reduce(torch.tensor(len(torch.cat(self.hits))), reduce_op="sum"))
        self.log("val_said", strategy.broadcast(float(self.trainer.global_rank) + 7))     # (rank 0's: 7)
        self.hits.clear()
        self.ran_by = self.trainer                              # (its callback_metrics, read after the run)


@pytest.mark.parametrize("devices", [1, 2])
def test_the_strategy_gathers_over_the_processes_and_is_the_identity_in_one(devices):
    model, expected = twins(Gathering)
    torch.manual_seed(0)
    alone = dptrain.fit(EpochEnds(), data(), data(32, 1), epochs=1, batch_size=16, shuffle=False, devices=1,
                        log=None)["history"][0]
    row = dptrain.fit(model, data(), data(32, 1), epochs=1, batch_size=16, shuffle=False, devices=devices,
                      log=None)["history"][0]
    assert row["test_rate"] == pytest.approx(alone["test_rate"], rel=1e-6)
    assert (row["test_seen"], row["test_said"]) == (32, 7)      # (every sample; rank 0's value)
    with pytest.raises(ValueError, match=r"reduce\(reduce_op='max'\): fit's takes 'sum' or 'mean'"):
        StrategyStandIn(TrainerStandIn(1, None)).reduce(torch.ones(1), reduce_op="max")
    with pytest.raises(ValueError, match=r"sync_grads=True.*loss=dptrain.whole_batch\(fn\)"):
        StrategyStandIn(TrainerStandIn(1, None)).all_gather(torch.ones(1), sync_grads=True)


class GatheringInTheStep(EpochEnds):
    def training_step(self, batch, batch_idx):
        self.all_gather(batch[1])           # (Lightning's DDP: once a process; here once a device's thread)
        return super().training_step(batch, batch_idx)


def test_the_strategy_asked_in_a_step_on_several_devices_of_a_process_is_an_error():
    assert dptrain.fit(GatheringInTheStep(), data(), epochs=1, batch_size=16, devices=1, log=None)["history"]
    with pytest.raises(RuntimeError, match=r"trainer.strategy.all_gather was called in a step on one of the "
                                           r"process's 2 devices, each of which would ask on its own"):
        dptrain.fit(GatheringInTheStep(), data(), epochs=1, batch_size=16, devices=2, log=None)


class ReadsItsOptimizer(EpochEnds):
    """Lightning's habit of logging the learning rate in the step: ``self.optimizers()`` and
    ``self.lr_schedulers()`` (the run's optimizer and scheduler)."""

    def training_step(self, batch, batch_idx):
        self.log("step_lr", self.optimizers().param_groups[0]["lr"])
        self.log("last_lr", self.lr_schedulers().get_last_lr()[0])
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}


@pytest.mark.parametrize("devices", [1, 2])
def test_the_module_reads_the_runs_optimizer_and_scheduler(devices):
    result = dptrain.fit(ReadsItsOptimizer(), data(), epochs=3, batch_size=16, devices=devices, log=None)
    assert [row["train_step_lr"] for row in result["history"]] == pytest.approx([0.2, 0.1, 0.05])
    assert [row["train_last_lr"] for row in result["history"]] == pytest.approx([0.2, 0.1, 0.05])


class ReadsTheRateAtTheEpochsEnd(ReadsItsOptimizer):
    """The rate a module reads at the epoch's last batch end, in its validation and its epoch-end
    hooks (``self.optimizers()``), its ``StepLR`` stepped every epoch."""
    seen = []

    def _read(self, where):
        ReadsTheRateAtTheEpochsEnd.seen.append((where, self.current_epoch, self.optimizers().param_groups[0]["lr"]))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 5:              # (the epoch's last of 6)
            self._read("batch_end")

    def configure_optimizers(self):
        config = super().configure_optimizers()
        self.made = config["optimizer"]
        return config

    def on_validation_epoch_end(self):
        self._read("validation_end")
        super().on_validation_epoch_end()

    def on_train_epoch_end(self):
        self._read("train_epoch_end")
        super().on_train_epoch_end()


@pytest.mark.parametrize("devices", [1, 2])
def test_an_epoch_schedulers_step_is_where_lightnings_trainer_makes_it(devices):
    """After the epoch's last update, before its on_train_batch_end, the validation and
    on_train_epoch_end (Lightning 2.6.6's Trainer by hand: the same reads); the row's ``lr``
    is still the one the epoch trained at, and an epoch max_steps cuts short is not stepped."""
    ReadsTheRateAtTheEpochsEnd.seen.clear()
    model = ReadsTheRateAtTheEpochsEnd()
    result = dptrain.fit(model, data(), data(), epochs=2, batch_size=16, shuffle=False, devices=devices, log=None,
                         progress=False)
    assert ReadsTheRateAtTheEpochsEnd.seen == [(where, epoch, pytest.approx(lr)) for epoch, lr in [(0, 0.1), (1, 0.05)]
                                               for where in ("batch_end", "validation_end", "train_epoch_end")]
    assert [row["lr"] for row in result["history"]] == pytest.approx([0.2, 0.1])
    assert [row["train_step_lr"] for row in result["history"]] == pytest.approx([0.2, 0.1])
    model = ReadsTheRateAtTheEpochsEnd()
    dptrain.fit(model, data(), epochs=2, batch_size=16, max_steps=9, devices=devices, log=None, progress=False)
    assert model.made.param_groups[0]["lr"] == pytest.approx(0.1)     # (stepped once: after epoch 1)


def test_configure_optimizers_is_called_once_when_the_run_has_its_data():
    calls = []

    class Counted(EpochEnds):
        def configure_optimizers(self):
            calls.append(getattr(self.trainer, "estimated_stepping_batches", None) if reads else "called")
            return torch.optim.SGD(self.parameters(), lr=0.1)
    for reads in (False, True):
        calls.clear()
        dptrain.fit(Counted(), data(), epochs=2, batch_size=16, devices=1, log=None)
        assert calls == ([12] if reads else ["called"])         # (was twice where it read the estimate)
