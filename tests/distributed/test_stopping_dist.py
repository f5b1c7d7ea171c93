"""Decisions every process must share: stop at the same batch; skip a step everywhere or nowhere."""
import math
import signal

import pytest
import torch

import dptrain
from dptrain.distributed import get_collective
from dptrain.engine.model_engine import ModelEngine
from dptrain.models import GluonLeNet, lenet, lenet_params
from dptrain.run.stopping import StopRequests
from tests.distributed.helpers import run_workers


def decide(rank, world):
    collective = get_collective()
    stops = StopRequests(collective)
    answers = []
    for batch in range(1, 5):
        flags = stops.before_batch()
        if batch == 2 and rank == 1:
            stops.signum = signal.SIGINT       # lands in rank 1 only, during batch 2
        # The flags ride with the gradients (summed here by hand), or, batch 3, could not ride.
        received = None if batch == 3 else collective.all_reduce(torch.tensor(flags))
        answers.append(stops.after_batch(batch, non_finite=batch == 1 and rank == 0, received=received))
        if batch == 3 and rank == 0:
            stops.signum = signal.SIGTERM
    answers.append(stops.flush())
    stops.barrier()
    return [(None if s is None else int(s), bad) for s, bad, *_ in answers]


def test_every_process_gets_the_same_answer_one_batch_later():
    a, b = run_workers(decide)
    INT, TERM = int(signal.SIGINT), int(signal.SIGTERM)
    # after batch 1: nothing seen yet; 2: rank 0's NaN of batch 1; 3: rank 1's SIGINT of
    # batch 2; 4 and the flush: SIGTERM (rank 0, between batches 3 and 4) wins over SIGINT.
    assert a == b == [(None, None), (None, 1), (INT, None), (TERM, None), (TERM, None)]


def test_one_process_decides_at_once():
    stops = StopRequests(get_collective())
    stops.before_batch()
    assert stops.after_batch(1, non_finite=True) == (None, 1, False, False)
    stops.signum = signal.SIGTERM
    stops.before_batch()
    assert stops.after_batch(2, non_finite=False) == (signal.SIGTERM, None, False, False)
    assert stops.flush() == (signal.SIGTERM, None, False, False)
    stops.request()
    assert stops.after_batch(3, non_finite=False).requested and stops.agree() == (True, False)
    stops.time_up()
    assert stops.after_batch(4, non_finite=False).time_up and stops.agree() == (True, True)


def request_on_one_rank(rank, world):
    collective = get_collective()
    stops = StopRequests(collective)
    answers = []
    for batch in range(1, 5):
        flags = stops.before_batch()
        if batch == 1 and rank == 1:
            stops.request()                    # a callback of rank 1 asks, during batch 1
        if batch == 2 and rank == 0:
            stops.time_up()                    # rank 0's clock passes max_time during batch 2
        decision = stops.after_batch(batch, False, collective.all_reduce(torch.tensor(flags)))
        answers.append((decision.requested, decision.time_up))
    agreed = stops.agree()
    stops.barrier()
    return answers, agreed


def test_a_stop_asked_on_one_process_is_heard_by_all_with_the_next_batch():
    a, b = run_workers(request_on_one_rank)
    assert a == b == ([(False, False), (True, False), (True, True), (True, True)], (True, True))


def batches(rank, poison_rank):
    """Step 1: finite everywhere; step 2: one NaN pixel in ``poison_rank``'s shard; step 3: finite."""
    g = torch.Generator().manual_seed(10 + rank)
    out = []
    for step in range(3):
        X, y = torch.rand(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        if step == 1 and rank == poison_rank:
            X[3, 0, 5, 5] = math.nan
        out.append((X, y))
    return out


def skip_scratch(rank, world, poison_rank):
    torch.manual_seed(0)
    dp = dptrain.ScratchDataParallel(lenet, lenet_params(), [dptrain.cpu(0)], collective=get_collective())
    losses, snapshots = [], []
    for X, y in batches(rank, poison_rank):
        losses.append(dp.train_batch(X, y, 0.1, skip_nonfinite=True).item())
        snapshots.append([p.detach().tolist() for p in dp.replicas[0]])   # tensors do not cross queues
    return losses, snapshots


def skip_module(rank, world, poison_rank, n_devices):
    torch.manual_seed(0)
    task = dptrain.Task(GluonLeNet(), train_data=(), optimizer="sgd",
                        optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    dp = ModelEngine(task, [dptrain.cpu(i) for i in range(n_devices)])
    losses, snapshots = [], []
    for X, y in batches(rank, poison_rank):
        losses.append(dp.train_batch((X, y), skip_nonfinite=True).loss.item())
        snapshots.append([p.detach().tolist() for p in dp.replicas[0].parameters()])
    return losses, snapshots


def check_skipped_everywhere(results):
    (loss_a, snaps_a), (loss_b, snaps_b) = [(losses, [[torch.tensor(p) for p in snap] for snap in snaps])
                                            for losses, snaps in results]
    for losses in (loss_a, loss_b):
        assert math.isfinite(losses[0]) and math.isnan(losses[1]) and math.isfinite(losses[2])
    for snaps in (snaps_a, snaps_b):        # step 2 changed nothing, step 3 did
        assert all(torch.equal(p, q) for p, q in zip(snaps[0], snaps[1]))
        assert not all(torch.equal(p, q) for p, q in zip(snaps[1], snaps[2]))
        assert all(torch.isfinite(p).all() for p in snaps[2])
    for p, q in zip(snaps_a[2], snaps_b[2]):  # the processes stay in step
        assert torch.equal(p, q)


@pytest.mark.parametrize("poison_rank", [0, 1])
def test_scratch_skips_in_every_process_when_one_sees_nan(poison_rank):
    check_skipped_everywhere(run_workers(skip_scratch, poison_rank))


@pytest.mark.parametrize("n_devices", [1, 2])
def test_trainer_skips_in_every_process_when_one_sees_nan(n_devices):
    check_skipped_everywhere(run_workers(skip_module, 1, n_devices))
