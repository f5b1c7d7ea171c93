"""``Schedule``: the scheduler stepped at the points its interval names, a plateau on its figure."""
import math

import pytest
import torch

import dptrain

from dptrain.run.schedule import Schedule


def made(kind, interval, eval_steps=None):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5) if kind == "plateau" \
        else torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()          # (as in training: the scheduler steps after the optimizer)
    return Schedule(scheduler, interval, eval_steps), opt


def lr(opt):
    return opt.param_groups[0]["lr"]


def test_each_interval_steps_at_its_points_only():
    schedule, opt = made("step", "batch")
    schedule.after_batch(1)
    schedule.after_epoch({"train_loss": 1.0}, True, True)
    assert lr(opt) == 0.5 and not schedule.after_step_evaluation({"test_loss": 1.0})
    schedule, opt = made("step", "epoch")
    schedule.after_batch(1)
    schedule.after_epoch({"train_loss": 1.0}, True, True)
    assert lr(opt) == 0.5
    assert Schedule(None, "batch", None).per_batch is False


def test_a_plateau_decides_on_the_test_loss_of_the_evaluations_its_interval_names():
    schedule, opt = made("plateau", "epoch")
    for loss in (1.0, 2.0):          # the second is worse: halved
        schedule.after_epoch({"train_loss": 0.0, "test_loss": loss}, True, True)
    schedule.after_epoch({"train_loss": 9.0}, False, True)            # not evaluated: no step
    assert lr(opt) == 0.5
    schedule.after_epoch({"train_loss": 9.0}, False, False)           # no evaluation set: the train loss
    assert lr(opt) == 0.25
    schedule, opt = made("plateau", "batch", eval_steps=5)
    schedule.after_batch(1)
    assert schedule.after_step_evaluation({"test_loss": 1.0}) and schedule.after_step_evaluation({"test_loss": 2.0})
    assert lr(opt) == 0.5
    with pytest.raises(ValueError, match="ReduceLROnPlateau stepped every batch has no figure to decide on"):
        made("plateau", "batch")


def plateau_on(monitor, mode="min", eval_steps=None, interval="epoch"):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    opt.step()
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, patience=0, factor=0.5)
    return Schedule(scheduler, interval, eval_steps, monitor), opt


def test_scheduler_monitor_names_the_figure_a_plateau_decides_on():
    """Keras's val_accuracy is test_acc; a figure of the evaluation passes over the epochs not
    evaluated, a training one is taken every epoch."""
    schedule, opt = plateau_on("val_accuracy", "max")
    for acc in (0.5, 0.6, 0.6):              # the third is no better: halved once
        schedule.after_epoch({"train_loss": 1.0, "test_loss": 9.0, "test_acc": acc}, True, True)
    schedule.after_epoch({"train_loss": 1.0}, False, True)
    assert lr(opt) == 0.5 and schedule.scheduler.last_epoch == 3
    schedule, opt = plateau_on("train_loss")
    for loss, evaluated in ((1.0, True), (2.0, False)):
        schedule.after_epoch({"train_loss": loss, **({"test_loss": 0.0} if evaluated else {})}, evaluated, True)
    assert lr(opt) == 0.5
    schedule, opt = plateau_on("test_f1", "max", eval_steps=5, interval="batch")
    assert schedule.after_step_evaluation({"step": 5, "train_loss": 1.0, "test_f1": 0.5})
    with pytest.raises(ValueError, match=r"scheduler_monitor 'test_f1' is not in the row's figures \(train_loss, "
                                         r"test_loss\): name one of them"):
        schedule.after_step_evaluation({"step": 10, "train_loss": 1.0, "test_loss": 0.5})


def test_a_plateau_that_takes_its_figure_the_wrong_way_and_a_monitor_without_a_plateau_are_errors():
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='max'\) decides on the test loss "
                                         r"\(scheduler_monitor None\), of which smaller is better: give it "
                                         r"mode='min', or scheduler_monitor='test_acc' to decide on a score"):
        plateau_on(None, "max")
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='min'\) decides on scheduler_monitor='val_acc', "
                                         r"of which larger is better: give it mode='max'$"):
        plateau_on("val_acc")
    assert plateau_on("test_spread", "max")[0].monitor == "test_spread"      # a name that does not say: its mode
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match="scheduler_monitor='test_acc' names the figure a ReduceLROnPlateau decides "
                                         "on, and StepLR is none: drop scheduler_monitor"):
        Schedule(torch.optim.lr_scheduler.StepLR(opt, 1), "epoch", None, "test_acc")
    with pytest.raises(ValueError, match="and there is no scheduler: drop scheduler_monitor"):
        Schedule(None, "epoch", None, "test_acc")


def test_a_scheduler_stepped_past_its_total_steps_is_an_error_before_the_run():
    """OneCycleLR raises at the step past total_steps: hours into a run, where the count was
    off (accumulation, a batch size changed). It is checked against what the run has left."""
    def one_cycle(total, interval, stepped=0):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=total)
        for _ in range(stepped):
            opt.step()
            scheduler.step()
        return Schedule(scheduler, interval, None)
    lines = []
    one_cycle(30, "batch").check_length(30, 3, lines.append)
    one_cycle(30, "batch", stepped=10).check_length(20, 2, lines.append)       # (resumed)
    one_cycle(3, "epoch").check_length(30, 3, lines.append)
    assert lines == []
    with pytest.raises(ValueError, match=r"OneCycleLR\(total_steps=29\) is stepped every update, 30 times in this "
                                         r"run, and raises at its step 30: give it total_steps=30 \(epochs x"):
        one_cycle(29, "batch").check_length(30, 3, lines.append)
    with pytest.raises(ValueError, match=r"give it total_steps=31 "):
        one_cycle(30, "batch", stepped=10).check_length(21, 3, lines.append)
    with pytest.raises(ValueError, match=r"OneCycleLR\(total_steps=2\) is stepped every epoch, 3 times in this run, "
                                         r"and raises at its step 3: give it total_steps=3 \(or scheduler_interval="):
        one_cycle(2, "epoch").check_length(30, 3, lines.append)
    one_cycle(30, "epoch").check_length(30, 3, lines.append)
    assert lines == ["dptrain: OneCycleLR(total_steps=30) is stepped every epoch, 3 times in this run, its schedule "
                     "30 steps long: give scheduler_interval='batch' if its steps are updates"]
    one_cycle(29, "batch").check_length(None, 3, lines.append)          # (an open-ended stream: not known)
    with pytest.raises(ValueError, match="stepped every update, 8 times in this run"):     # accumulation: updates
        dptrain.fit(torch.nn.Linear(3, 2), (torch.randn(64, 3), torch.randint(0, 2, (64,))), epochs=2, batch_size=8,
                    accumulate_grad_batches=2, scheduler_interval="batch", log=None, devices=1,
                    scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=7))


def test_a_plateau_on_an_evaluation_figure_without_an_evaluation_set_is_an_error_before_the_first_epoch():
    model = torch.nn.Linear(3, 2)
    before = model.weight.detach().clone()
    plateau = lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max")     # noqa: E731
    data = (torch.randn(16, 3), torch.randint(0, 2, (16,)))
    with pytest.raises(ValueError, match=r"scheduler_monitor='val_accuracy' monitors val_accuracy, a figure of the "
                                         r"evaluation, but the run has no evaluation set: give eval_data"):
        dptrain.fit(model, data, epochs=2, batch_size=8, log=None, devices=1, scheduler=plateau,
                    scheduler_monitor="val_accuracy")
    assert torch.equal(model.weight, before)                        # not a step trained
    result = dptrain.fit(model, data, data, epochs=1, batch_size=8, log=None, devices=1, scheduler=plateau,
                         scheduler_monitor="val_accuracy")
    assert "test_acc" in result["history"][0]


def test_a_plateau_decides_on_a_figure_a_callback_adds_to_the_row():
    """Keras's habit: a callback computes a figure into the epoch's logs, and a plateau after it
    watches it (the scheduler steps after the callbacks' on_epoch_end, as Lightning's does)."""
    class Scored(dptrain.Callback):
        def on_epoch_end(self, run, epoch, row):
            row["test_score"] = 1 / epoch           # (worse every epoch: the plateau cuts each time)

    data = (torch.randn(16, 3), torch.randint(0, 2, (16,)))
    result = dptrain.fit(torch.nn.Linear(3, 2), data, data, epochs=3, batch_size=8, log=None, devices=1,
                         optimizer=lambda params: torch.optim.SGD(params, lr=0.1), callbacks=[Scored()],
                         scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, "max", 0.5, 0),
                         scheduler_monitor="val_score")
    assert [row["lr"] for row in result["history"]] == pytest.approx([0.1, 0.1, 0.05])


class TimmCosine:
    """timm's scheduler shape (``timm.scheduler.Scheduler``): the training code gives the counts,
    ``step(epoch)`` at each epoch's end and ``step_update(num_updates)`` after each update."""

    def __init__(self, optimizer, t_initial, warmup_t=0, warmup_lr_init=0.0, t_in_epochs=True):
        self.optimizer, self.t_initial, self.t_in_epochs = optimizer, t_initial, t_in_epochs
        self.warmup_t, self.warmup_lr_init = warmup_t, warmup_lr_init
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_values = [group["initial_lr"] for group in optimizer.param_groups]
        self._update(0)

    def _update(self, t):
        for group, base in zip(self.optimizer.param_groups, self.base_values):
            group["lr"] = self.warmup_lr_init + t * (base - self.warmup_lr_init) / self.warmup_t if t < self.warmup_t \
                else 0.5 * base * (1 + math.cos(math.pi * min(t, self.t_initial) / self.t_initial))

    def step(self, epoch, metric=None):
        if self.t_in_epochs:
            self._update(epoch)

    def step_update(self, num_updates, metric=None):
        if not self.t_in_epochs:
            self._update(num_updates)

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state):
        self.__dict__.update(state)


def timm_data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 5, generator=g, dtype=torch.float64)
    return X, X[:, :3].argmax(1)


def timm_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()


def timm_plain(make_scheduler, epochs=3):
    """timm's training script: step_update(num_updates) after each update, step(epoch + 1) after each epoch."""
    model = timm_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    scheduler, updates, lrs = make_scheduler(opt), 0, []
    X, y = timm_data()
    for epoch in range(epochs):
        for i in range(0, 64, 16):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(X[i:i + 16]), y[i:i + 16]).backward()
            opt.step()
            updates += 1
            scheduler.step_update(num_updates=updates)
            lrs.append(opt.param_groups[0]["lr"])
        scheduler.step(epoch + 1)
    return model, lrs


@pytest.mark.parametrize("in_epochs", [True, False])
@pytest.mark.parametrize("devices", ["cpu:0", "cpu:0,cpu:1"])
def test_a_scheduler_of_timms_kind_gets_the_counts_timms_training_script_gives(in_epochs, devices, tmp_path):
    """It was stepped as torch's, step(): "missing 1 required positional argument: 'epoch'",
    after the first epoch had trained."""
    def make(opt):
        return TimmCosine(opt, t_initial=3 if in_epochs else 12, warmup_t=1 if in_epochs else 3, warmup_lr_init=0.01,
                          t_in_epochs=in_epochs)
    plain, lrs = timm_plain(make)
    common = dict(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9), scheduler=make, batch_size=16,
                  shuffle=False, log=None, devices=devices, log_every_n_steps=1, checkpoint_dir=str(tmp_path))
    first = dptrain.fit(timm_model(), timm_data(), epochs=1, **common)
    model = timm_model()
    rest = dptrain.fit(model, timm_data(), epochs=3, resume=True, **common)       # (counting on from the checkpoint)
    assert [row["lr"] for row in first["step_history"]] == pytest.approx(lrs[:4], abs=1e-15)
    assert [row["lr"] for row in rest["step_history"]] == pytest.approx(lrs, abs=1e-15)     # (the first kept)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_a_plateau_of_timms_kind_that_takes_its_figure_the_wrong_way_is_an_error_before_the_run():
    class TimmPlateau(TimmCosine):      # timm's PlateauLRScheduler: torch's inside, mode "max" by default
        def __init__(self, optimizer, mode="max"):
            super().__init__(optimizer, t_initial=3)
            self.lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode=mode)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(mode='max'\) decides on the test loss"):
        Schedule(TimmPlateau(opt), "epoch", None)
    assert Schedule(TimmPlateau(opt), "epoch", None, monitor="test_acc").counted
