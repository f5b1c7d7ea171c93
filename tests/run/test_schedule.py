"""``Schedule``: the scheduler stepped at the points its interval names, a plateau on its figure."""
import pytest
import torch

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
    schedule.after_batch()
    schedule.after_epoch({"train_loss": 1.0}, True, True)
    assert lr(opt) == 0.5 and not schedule.after_step_evaluation({"test_loss": 1.0})
    schedule, opt = made("step", "epoch")
    schedule.after_batch()
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
    schedule.after_batch()
    assert schedule.after_step_evaluation({"test_loss": 1.0}) and schedule.after_step_evaluation({"test_loss": 2.0})
    assert lr(opt) == 0.5
    with pytest.raises(ValueError, match="ReduceLROnPlateau stepped every batch has no figure to decide on"):
        made("plateau", "batch")
