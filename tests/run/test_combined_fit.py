"""fit with several optimizers on one loss (``optimizer={name: optimizer}`` or a list, one
``loss``/``step``): trains as the plain loop stepping each optimizer after one backward, on 1
and 2 devices, with clipping over every parameter, accumulation and a schedule per group;
Muon with AdamW, SparseAdam with Adam; the user's optimizers hold the state at the end; a
resumed run ends as the unbroken one; what does not fit is refused with the fix."""

import pytest
import torch
from torch import nn

import dptrain
from tests.parallel.test_combined import assert_same, net, parts
from tests.parallel.test_combined import plain as plain_steps


def data(n=48):
    g = torch.Generator().manual_seed(2)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def schedule(optimizer):
    """A function per group: the weights' rate halves each batch, the biases' stays."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda k: 0.5 ** k, lambda k: 1.0])


def plain(model, optimizers, X, y, epochs=2, batch=12, accumulate=1, max_norm=None):
    """The plain loop: one backward, every optimizer steps; the schedule as ``schedule``."""
    sgd_lr, k = optimizers["sgd"].param_groups[0]["lr"], 0
    for _ in range(epochs):
        for start in range(0, len(X), batch):
            part = slice(start, start + batch)
            (nn.functional.cross_entropy(model(X[part]), y[part]) / accumulate).backward()
            if (start // batch + 1) % accumulate:
                continue
            if max_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            for o in optimizers.values():
                o.step()
                o.zero_grad()
            k += 1
            optimizers["sgd"].param_groups[0]["lr"] = sgd_lr * 0.5 ** k
    return model


SETTINGS = {"batch_size": 12, "shuffle": False, "log": None, "progress": False, "epochs": 2}


@pytest.mark.parametrize("devices, accumulate", [(1, 1), (2, 1), (2, 2)])
def test_it_trains_as_the_plain_loop_stepping_each_optimizer(devices, accumulate):
    X, y = data()
    want = net()
    want_optimizers = parts(want)
    plain(want, want_optimizers, X, y, accumulate=accumulate, max_norm=0.3)
    model = net()
    optimizers = parts(model)
    result = dptrain.fit(model, (X, y), optimizer=optimizers, scheduler=schedule, scheduler_interval="batch",
                         clip_grad_norm=0.3, accumulate_grad_batches=accumulate,
                         devices=[dptrain.cpu(0)] * devices, **SETTINGS)
    assert_same(model, want, 1e-5)
    # Each optimizer's learning rate in the rows, as the next update uses it (the schedule's).
    assert [row["lr_sgd"] for row in result["history"]] == pytest.approx([0.1 * 0.5 ** (4 // accumulate),
                                                                         0.1 * 0.5 ** (8 // accumulate)])
    assert [row["lr_adam"] for row in result["history"]] == [0.05, 0.05] and "lr" not in result["history"][0]
    # The user's optimizers hold the state training reached (the learning rate the schedule set too).
    assert optimizers["sgd"].param_groups[0]["lr"] == pytest.approx(want_optimizers["sgd"].param_groups[0]["lr"])
    plain(model, optimizers, X, y, epochs=1)
    plain(want, want_optimizers, X, y, epochs=1)
    assert_same(model, want, 1e-5)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon is new in torch 2.9")
def test_muon_for_the_matrices_and_adamw_for_the_rest_on_two_devices():
    X, y = data()

    def optimizers(model):
        matrices = [p for p in model.parameters() if p.ndim == 2]
        return [torch.optim.Muon(matrices, lr=0.02), torch.optim.AdamW([p for p in model.parameters() if p.ndim != 2])]

    want = net()
    mine = optimizers(want)
    for start in range(0, 48, 12):
        nn.functional.cross_entropy(want(X[start:start + 12]), y[start:start + 12]).backward()
        for o in mine:
            o.step()
            o.zero_grad()
    model = net()
    result = dptrain.fit(model, (X, y), optimizer=optimizers(model), devices=[dptrain.cpu(0)] * 2,
                         **{**SETTINGS, "epochs": 1})
    assert_same(model, want, 1e-5)
    assert result["optimizer"] == "Muon+AdamW"


def test_sparse_adam_for_an_embedding_and_adam_for_the_rest_on_two_devices():
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embedding, self.out = nn.Embedding(30, 4, sparse=True), nn.Linear(4, 3)

        def forward(self, x):
            return self.out(self.embedding(x).mean(1))

    g = torch.Generator().manual_seed(3)
    X, y = torch.randint(0, 30, (36, 5), generator=g), torch.randint(0, 3, (36,), generator=g)

    def optimizers(model):
        return {"sparse": torch.optim.SparseAdam(list(model.embedding.parameters()), lr=0.05),
                "dense": torch.optim.Adam(model.out.parameters(), lr=0.05)}

    want = Bag()
    mine = optimizers(want)
    for start in range(0, 36, 12):
        nn.functional.cross_entropy(want(X[start:start + 12]), y[start:start + 12]).backward()
        for o in mine.values():
            o.step()
            o.zero_grad()
    model = Bag()
    dptrain.fit(model, (X, y), optimizer=optimizers(model), devices=[dptrain.cpu(0)] * 2, **{**SETTINGS, "epochs": 1})
    assert_same(model, want, 1e-5)


def test_a_resumed_run_ends_as_the_unbroken_one(tmp_path):
    X, y = data()
    whole = net()
    dptrain.fit(whole, (X, y), optimizer=parts(whole), scheduler=schedule, scheduler_interval="batch", **SETTINGS)
    cut = net()
    dptrain.fit(cut, (X, y), optimizer=parts(cut), scheduler=schedule, scheduler_interval="batch", max_steps=6,
                checkpoint_dir=str(tmp_path), devices=[dptrain.cpu(0)] * 2, **SETTINGS)
    resumed = net()
    dptrain.fit(resumed, (X, y), optimizer=parts(resumed), scheduler=schedule, scheduler_interval="batch",
                checkpoint_dir=str(tmp_path), resume=True, **SETTINGS)
    assert_same(resumed, whole, 1e-5)
    other = net()                   # another kind of optimizer cannot take the checkpoint's state
    with pytest.raises(ValueError, match="the checkpoint's optimizer is 'SGD\\+Adam', this run's 'AdamW'"):
        dptrain.fit(other, (X, y), optimizer=torch.optim.AdamW(other.parameters()), checkpoint_dir=str(tmp_path),
                    resume=True, **SETTINGS)


@pytest.mark.parametrize("optimizer, settings, error, said", [
    ({"sgd": torch.optim.SGD, "adam": torch.optim.Adam}, {}, TypeError, "each names its parameters"),
    (None, {"scheduler": {"sgd": schedule, "adams": schedule}}, TypeError, "unknown names \\['adams'\\]"),
    ("list", {"scheduler": [schedule]}, TypeError, "one entry \\(or None\\) per optimizer, 2 here"),
    ("one", {"scheduler": {"sgd": schedule}}, TypeError, "goes with several optimizers"),
    (None, {"lr": 0.1}, ValueError, "lr: not taken with several optimizers on one loss \\(SGD\\+Adam\\)"),
    ("twice", {}, ValueError, "is in optimizer\\['sgd'\\] and optimizer\\['adam'\\]"),
    ("foreign", {}, ValueError, "not the model's"),
])
def test_what_does_not_fit_is_refused_with_the_fix(optimizer, settings, error, said):
    model = net()
    if optimizer is None:
        optimizer = parts(model)
    elif optimizer == "list":
        optimizer = list(parts(model).values())
    elif optimizer == "one":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    elif optimizer == "twice":
        optimizer = {"sgd": torch.optim.SGD(model.parameters(), lr=0.1), "adam": torch.optim.Adam(model[0].parameters())}
    elif optimizer == "foreign":
        optimizer = [torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam([nn.Parameter(torch.zeros(2))])]
    with pytest.raises(error, match=said):
        dptrain.fit(model, data(), optimizer=optimizer, **{**SETTINGS, **settings})


def test_a_task_takes_them_too_and_says_so_in_its_fingerprint():
    model = net()
    task = dptrain.Task(model, data(), optimizer=parts(model))
    assert isinstance(task.optimizer, dptrain.CombinedOptimizer) and not task.several
    from dptrain.run.agreement import describe_callable
    assert describe_callable(task.optimizer).startswith("combined{sgd: SGD(")


def test_devices_auto_measures_a_copy_and_evaluation_is_one_optimizers():
    X, y = data()
    want = net()
    want_optimizers = parts(want)
    plain(want, want_optimizers, X, y)
    model = net()
    result = dptrain.fit(model, (X, y), (X, y), optimizer=parts(model), scheduler=schedule, scheduler_interval="batch",
                         devices="auto", **SETTINGS)
    assert_same(model, want, 1e-5)
    with torch.no_grad():
        accuracy = (want(X).argmax(1) == y).float().mean().item()
    assert result["test_acc"] == pytest.approx(accuracy)


def step_and_cosine(optimizers):
    """A scheduler of each optimizer's own: the SGD's rate halves each batch, Adam's is annealed."""
    return {"sgd": torch.optim.lr_scheduler.StepLR(optimizers["sgd"], 1, gamma=0.5),
            "adam": torch.optim.lr_scheduler.CosineAnnealingLR(optimizers["adam"], T_max=8)}


@pytest.mark.parametrize("devices, listed", [(1, False), (2, True)])
def test_each_optimizer_takes_a_scheduler_of_its_own_as_in_the_plain_loop(devices, listed):
    X, y = data()
    want = net()
    want_optimizers = parts(want)
    want_schedulers = step_and_cosine(want_optimizers)
    lrs = []
    for _ in range(2):
        for start in range(0, len(X), 12):
            plain_steps(want, want_optimizers, [(X[start:start + 12], y[start:start + 12])])
            for s in want_schedulers.values():
                s.step()
        lrs.append((want_optimizers["sgd"].param_groups[0]["lr"], want_optimizers["adam"].param_groups[0]["lr"]))
    model = net()
    optimizers = parts(model)
    factories = {"sgd": lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
                 "adam": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=8)}
    given = (list(optimizers.values()), list(factories.values())) if listed else (optimizers, factories)
    result = dptrain.fit(model, (X, y), optimizer=given[0], scheduler=given[1], scheduler_interval="batch",
                         devices=[dptrain.cpu(0)] * devices, **SETTINGS)
    assert_same(model, want, 1e-5)
    got = [(row["lr_sgd"], row["lr_adam"]) for row in result["history"]]
    assert [lr for pair in got for lr in pair] == pytest.approx([lr for pair in lrs for lr in pair], abs=1e-9)


def test_schedulers_of_their_own_resume_where_they_were(tmp_path):
    X, y = data()
    factories = {"sgd": lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
                 "adam": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=8)}
    settings = {**SETTINGS, "scheduler": factories, "scheduler_interval": "batch"}
    whole = net()
    dptrain.fit(whole, (X, y), optimizer=parts(whole), **settings)
    cut = net()
    dptrain.fit(cut, (X, y), optimizer=parts(cut), max_steps=5, checkpoint_dir=str(tmp_path), **settings)
    resumed = net()
    result = dptrain.fit(resumed, (X, y), optimizer=parts(resumed), checkpoint_dir=str(tmp_path), resume=True,
                         devices=[dptrain.cpu(0)] * 2, **settings)
    assert_same(resumed, whole, 1e-5)
    assert result["history"][-1]["lr_sgd"] == pytest.approx(0.1 * 0.5 ** 8)
    other = net()           # one scheduler over both cannot take theirs
    with pytest.raises(ValueError, match="cannot resume"):
        dptrain.fit(other, (X, y), optimizer=parts(other), checkpoint_dir=str(tmp_path), resume=True,
                    **{**settings, "scheduler": schedule})
