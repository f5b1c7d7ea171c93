"""Two models, two Trainers taking turns on every batch (a GAN): N devices train as the
plain loop does on one (tests/tasks/gan.py), whichever way the discriminator's gradients
from the generator's step are kept out of its next update."""
import pytest
import torch

import dptrain
from tests.tasks import gan as g


def two_trainers(devices, kvstore="device", way="freeze", data=None):
    """The README's loop: the discriminator's update, then the generator's, each a Trainer."""
    model = g.GAN()
    G, D = dptrain.replicate(model.generator, devices), dptrain.replicate(model.discriminator, devices)
    train_g = dptrain.Trainer(G, g.adam(model.generator), kvstore=kvstore)
    train_d = dptrain.Trainer(D, g.adam(model.discriminator), kvstore=kvstore)
    for real, z in data or g.batches():
        reals, zs = dptrain.split_batch(real, z, devices, even_split=False)

        def d_part(i):
            loss = g.bce(D[i](reals[i]), 1.0, "sum") + g.bce(D[i](G[i](zs[i]).detach()), 0.0, "sum")
            loss.backward()
            return loss.detach()

        def g_part(i):
            loss = g.bce(D[i](G[i](zs[i])), 1.0, "sum")
            loss.backward()
            return loss.detach()
        train_d.step_with(d_part, len(real))
        if way == "freeze":
            D.requires_grad_(False)     # no gradient for D in G's step, on any device
        train_g.step_with(g_part, len(real))
        if way == "freeze":
            D.requires_grad_(True)
        elif way == "discard":
            train_d.discard_gradients()     # as the plain loop's opt_d.zero_grad()
    train_g.close(), train_d.close()
    return model


def assert_same(got, want, **tol):
    for (name, p), q in zip(got.named_parameters(), want.parameters()):
        torch.testing.assert_close(p, q, msg=name, **tol)


@pytest.mark.parametrize("way", ["freeze", "discard"])
@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("n_devices", [1, 2, 3])
def test_a_gan_on_n_devices_trains_as_the_plain_loop(n_devices, kvstore, way):
    devices = [dptrain.cpu(i) for i in range(n_devices)]
    assert_same(two_trainers(devices, kvstore if n_devices > 1 else None, way), g.plain_loop())


def test_the_discriminators_gradients_from_the_generators_step_count_unless_cleared():
    """As in PyTorch, gradients add up until cleared: a loop that neither freezes D nor clears
    its gradients after G's step trains D on them too, on 1 device as on 2."""
    one = two_trainers([dptrain.cpu(0)], None, way=None)
    two = two_trainers([dptrain.cpu(0), dptrain.cpu(1)], way=None)
    assert_same(two, one)
    with pytest.raises(AssertionError):
        assert_same(one, g.plain_loop())


def test_requires_grad_reaches_every_replica():
    replicas = dptrain.replicate(torch.nn.Linear(2, 2), [dptrain.cpu(0), dptrain.cpu(1)])
    assert replicas.requires_grad_(False) is replicas
    assert not any(p.requires_grad for m in replicas for p in m.parameters())
    replicas.requires_grad_()
    assert all(p.requires_grad for m in replicas for p in m.parameters())
