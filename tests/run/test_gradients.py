"""A callback's ``on_gradients``: each update's gradient, as the plain loop's ``p.grad`` holds
it before clipping and ``optimizer.step()`` (``run/gradients.py``), on 1-3 devices, every
kvstore, with clipping and accumulation, sparse gradients, several optimizers and 2
processes; and what it cannot be (written to, with a closure's optimizer) is an error."""
import copy
import functools

import pytest
import torch
from torch import nn

import dptrain
from tests.distributed.helpers import run_workers
from tests.tasks import gan as g

N, BATCH, EPOCHS = 96, 32, 2


def data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (N,), generator=gen)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 3)).double()


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def plain(model, clip=None, accumulate=1):
    """Each update's ``p.grad`` after backward (the micro-batches' together), before clipping."""
    X, y = data()
    opt, seen, micro = sgd(model.parameters()), [], BATCH // accumulate
    for _ in range(EPOCHS):
        for i in range(0, N, BATCH):
            opt.zero_grad()
            for k in range(i, i + BATCH, micro):
                (nn.functional.cross_entropy(model(X[k:k + micro]), y[k:k + micro]) / accumulate).backward()
            seen.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
    return seen


class Keep(dptrain.Callback):
    def __init__(self):
        self.grads, self.steps, self.ends = [], [], []

    def on_gradients(self, run, batch, grads):
        self.grads.append({n: t.clone() for n, t in grads.items()})
        self.steps.append((batch.step, run.step))

    def on_batch_end(self, run, batch):
        self.ends.append(batch.step)


def fitted(model, keep=None, **settings):
    keep = keep or Keep()
    settings = {"optimizer": functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), "epochs": EPOCHS,
                "batch_size": BATCH, "shuffle": False, "log": None, "progress": False, "sync_batchnorm": True, **settings}
    dptrain.fit(model, data(), callbacks=[keep], **settings)
    return keep


def assert_same(got, want, tol=1e-12):
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        assert list(g_) == list(w)
        for name in w:
            torch.testing.assert_close(g_[name], w[name], rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("devices, kvstore", [(1, "device"), (2, "device"), (3, "device"), (2, "local"),
                                              (3, "ring")])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_each_update_gives_the_plain_loops_gradient_before_clipping(devices, kvstore, clip):
    keep = fitted(net(), devices=devices, kvstore=kvstore, clip_grad_norm=clip)
    assert_same(keep.grads, plain(net(), clip))
    assert keep.steps == [(s, s) for s in range(1, 7)] and keep.ends == list(range(1, 7))
    assert all(t.device == torch.device("cpu") and t.dtype == torch.float64 for t in keep.grads[0].values())


@pytest.mark.parametrize("devices", [1, 2])
def test_accumulated_micro_batches_give_one_gradient_an_update(devices):
    keep = fitted(net(), devices=devices, accumulate_grad_batches=2, batch_size=BATCH // 2)
    assert_same(keep.grads, plain(net(), accumulate=2))
    assert len(keep.grads) == len(keep.ends) == 6      # (a batch of the loop is an update of 2 micro-batches)


def test_frozen_and_unused_parameters_have_none():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.unused, self.head = net(), nn.Linear(5, 3).double(), nn.Linear(3, 3).double()
            self.head.requires_grad_(False)

        def forward(self, x):
            return self.head(self.body(x))
    keep = fitted(Branchy(), devices=2)
    assert all(list(grads) == [f"body.{n}" for n, _ in net().named_parameters()] for grads in keep.grads)


def test_a_sparse_embeddings_gradient_is_the_plain_loops():
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Flatten(), nn.Linear(8, 3)).double()
    tokens = torch.randint(0, 20, (N, 2), generator=torch.Generator().manual_seed(3))
    y = data()[1]
    reference, want = model(), []
    optimizers = [torch.optim.SparseAdam(list(reference[0].parameters()), lr=0.01),
                  torch.optim.Adam(reference[2].parameters(), lr=0.01)]
    for i in range(0, N, BATCH):
        for o in optimizers:
            o.zero_grad()
        nn.functional.cross_entropy(reference(tokens[i:i + BATCH]), y[i:i + BATCH]).backward()
        want.append({n: p.grad.to_dense() for n, p in reference.named_parameters()})
        for o in optimizers:
            o.step()
    for devices in (1, 2):
        trained, keep = model(), Keep()
        dptrain.fit(trained, (tokens, y), epochs=1, batch_size=BATCH, shuffle=False, log=None, devices=devices,
                    callbacks=[keep], optimizer=[torch.optim.SparseAdam(list(trained[0].parameters()), lr=0.01),
                                                 torch.optim.Adam(trained[2].parameters(), lr=0.01)])
        assert keep.grads[0]["0.weight"].is_sparse
        assert_same([{n: t.to_dense() for n, t in grads.items()} for grads in keep.grads], want)


def test_several_optimizers_give_each_parameter_its_updates_gradient():
    want = []
    gan = g.GAN()
    opt_d, opt_g = g.adam(gan.discriminator), g.adam(gan.generator)
    for real, z in g.batches():
        opt_d.zero_grad()
        g.d_loss(gan, real, z).backward()
        seen = {f"discriminator.{n}": p.grad.clone() for n, p in gan.discriminator.named_parameters()}
        opt_d.step()
        opt_g.zero_grad()
        g.g_loss(gan, z).backward()
        seen.update({f"generator.{n}": p.grad.clone() for n, p in gan.generator.named_parameters()})
        opt_g.step()
        want.append({n: seen[n] for n, _ in gan.named_parameters()})
    for devices in (1, 2):
        keep, model = Keep(), g.GAN()
        batches = g.batches()
        dptrain.fit(model, (torch.cat([r for r, _ in batches]), torch.cat([z for _, z in batches])), epochs=1,
                    batch_size=16, shuffle=False, log=None, devices=devices, callbacks=[keep],
                    step={"discriminator": lambda m, b: g.d_loss(m, *b), "generator": lambda m, b: g.g_loss(m, b[1])},
                    optimizer={"discriminator": g.adam(model.discriminator), "generator": g.adam(model.generator)})
        assert_same(keep.grads, want, tol=1e-5)


def two_processes(rank, world, devices):
    keep = fitted(net(), devices=devices, clip_grad_norm=0.5)
    return [{n: t.tolist() for n, t in grads.items()} for grads in keep.grads]


@pytest.mark.parametrize("devices", [1, 2])
def test_two_processes_give_every_process_the_whole_batchs_gradient(devices):
    first, second = run_workers(two_processes, devices)
    assert first == second
    assert_same([{n: torch.tensor(t, dtype=torch.float64) for n, t in grads.items()} for grads in first],
                plain(net(), 0.5))


def test_writing_to_a_gradient_is_an_error_naming_what_changes_one():
    class Scale(dptrain.Callback):
        def on_gradients(self, run, batch, grads):
            grads["3.weight"].mul_(0.5)
    with pytest.raises(ValueError, match=r"on_gradients wrote to the gradient of '3.weight'.*after the update.*"
                                         r"p.register_hook.*clip_grad_norm="):
        fitted(net(), keep=Scale())


def test_an_optimizer_taking_a_closure_is_an_error():
    with pytest.raises(ValueError, match="LBFGS.step needs a closure.*a callback's on_gradients"):
        fitted(net(), optimizer=functools.partial(torch.optim.LBFGS, lr=0.1), devices=2)


def test_a_run_whose_callbacks_do_not_ask_keeps_no_copy():
    seen = []

    class Look(dptrain.Callback):
        def on_batch_end(self, run, batch):
            trainer = run.engine.trainer
            seen.append((trainer.keep_grads, trainer.report.holds_grads))
    fitted(net(), keep=Look(), devices=2)
    assert seen and all(s == (False, 0) for s in seen)
