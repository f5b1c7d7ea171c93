"""ModelEdits: an in-place edit of the first replica's parameters reaches the others, and only it."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.parallel.model_edits import ModelEdits


def replicas(n=3):
    torch.manual_seed(0)
    return dptrain.replicate(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), [dptrain.cpu(i) for i in range(n)])


def test_an_edit_reaches_every_replica_and_nothing_else_is_copied():
    reps = replicas()
    edits = ModelEdits(reps)
    assert edits.after("in a test") is False                 # nothing edited: nothing done
    others = [[p._version for p in m.parameters()] for m in list(reps)[1:]]
    with torch.no_grad():
        reps[0][1].weight.fill_(0.5)
    assert edits.after("in a test") is True
    for m, before in zip(list(reps)[1:], others):
        assert torch.equal(m[1].weight, torch.full((2, 4), 0.5))
        moved = [p._version != v for p, v in zip(m.parameters(), before)]
        assert moved == [False, False, True, False]          # the edited weight alone was copied
    assert edits.after("in a test") is False


def test_a_step_is_not_an_edit():
    reps = replicas(2)
    edits = ModelEdits(reps)
    with torch.no_grad():
        for m in reps:                  # as an update writes every replica alike
            m[0].bias.add_(1.0)
    edits.stepped()
    assert edits.after("in a test") is False


def test_requires_grad_set_on_the_first_replica_is_set_on_all_in_both_directions():
    reps = replicas(2)
    for m in reps:
        m[1].requires_grad_(False)
    edits = ModelEdits(reps)
    reps[0][0].requires_grad_(False)
    edits.after("in on_batch_end")
    assert [p.requires_grad for p in reps[1].parameters()] == [False] * 4
    reps[0][0].requires_grad_(True)
    reps[0][1].requires_grad_(True)                        # frozen at the start: unfrozen too
    edits.after("in on_batch_end")
    assert [p.requires_grad for p in reps[1].parameters()] == [True] * 4


def test_a_trainer_told_of_a_layer_unfrozen_that_no_group_holds_names_the_hook_and_the_fix():
    reps = replicas(2)
    for m in reps:
        m[0].requires_grad_(False)
    trainer = dptrain.Trainer(reps, "sgd")                 # built on what trains: layer 1
    edits = ModelEdits(reps, trainer)
    reps[0][0].requires_grad_(True)
    with pytest.raises(ValueError, match=r"in on_epoch_start: requires_grad was set on 0.weight, 0.bias, but no "
                                         r"group of the optimizer holds them.*add_param_group"):
        edits.after("in on_epoch_start")


def test_plain_attributes_follow_the_first_replica_but_not_each_replicas_own():
    reps = replicas(3)
    for i, m in enumerate(reps):
        m[0].device_index = i           # set per replica before training, as SyncBatchNorm's rank
    edits = ModelEdits(reps)
    reps[0][1].beta = 0.25              # a new attribute, as a KL-annealing callback sets
    reps[0].eval()                      # BatchNorm frozen by a callback
    reps[0][0].device_index = 7
    edits.after("in a test")
    for m in list(reps)[1:]:
        assert m[1].beta == 0.25 and not m.training and not m[0].training
    assert [m[0].device_index for m in reps] == [7, 1, 2]


def test_a_buffer_written_in_place_reaches_every_replica():
    torch.manual_seed(0)
    reps = dptrain.replicate(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), [dptrain.cpu(0), dptrain.cpu(1)])
    edits = ModelEdits(reps)
    with torch.no_grad():
        reps[0][1].running_var.fill_(4.0)
    assert edits.after("in a test") is True
    assert torch.equal(reps[1][1].running_var, torch.full((4,), 4.0))
