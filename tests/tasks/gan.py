"""A small GAN on 2-D points, and the plain PyTorch loop that trains it on one device: the
reference for two optimizers taking turns on every batch (the discriminator's update, then
the generator's through the updated discriminator), as DCGAN scripts and Keras's and
Lightning's GAN examples write it."""
import torch
import torch.nn.functional as F
from torch import nn

LATENT = 4


class GAN(nn.Module):
    """A generator and a discriminator in one module, as Keras's and Lightning's GANs hold them."""

    def __init__(self, seed=0, batchnorm=False):
        super().__init__()
        torch.manual_seed(seed)
        norm = (lambda: nn.BatchNorm1d(32)) if batchnorm else nn.Identity      # (DCGAN's BatchNorm)
        self.generator = nn.Sequential(nn.Linear(LATENT, 32), norm(), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), norm(), nn.LeakyReLU(0.2), nn.Linear(32, 1))


def adam(module):
    return torch.optim.Adam(module.parameters(), lr=1e-2, betas=(0.5, 0.999))


def batches(steps=5, n=16, seed=1):
    """``steps`` global batches of ``(real points, latent codes)``."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 2, generator=g) * 0.5 + 2, torch.randn(n, LATENT, generator=g)) for _ in range(steps)]


def bce(logits, target, reduction="mean"):
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target), reduction=reduction)


def d_loss(gan, real, z, reduction="mean"):
    fake = gan.generator(z).detach()
    return bce(gan.discriminator(real), 1.0, reduction) + bce(gan.discriminator(fake), 0.0, reduction)


def g_loss(gan, z, reduction="mean"):
    return bce(gan.discriminator(gan.generator(z)), 1.0, reduction)


def plain_loop(data=None, batchnorm=False):
    """The discriminator's step, then the generator's, on each batch: one device."""
    gan = GAN(batchnorm=batchnorm)
    opt_d, opt_g = adam(gan.discriminator), adam(gan.generator)
    for real, z in data or batches():
        opt_d.zero_grad()
        d_loss(gan, real, z).backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss(gan, z).backward()
        opt_g.step()
    return gan
