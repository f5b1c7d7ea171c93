"""The GAN of examples/gan.py as Lightning 2 writes it: a LightningModule stepping its two
optimizers itself (``automatic_optimization = False``), handed to ``fit`` as it is.

    python examples/lightning_gan.py                          # all GPUs, else the CPU
    python examples/lightning_gan.py --devices 2              # 2 virtual CPU devices (they take turns)
    dptrain launch --processes 2 examples/lightning_gan.py    # 2 processes (torchrun works too)

``training_step`` is Lightning's recipe: ``self.optimizers()``, ``toggle_optimizer``,
``self.manual_backward(loss)``, ``opt.step()``, ``opt.zero_grad()``, the generator's scheduler
stepped by ``self.lr_schedulers()`` each batch, both losses given to ``self.log``. Under ``fit``
each ``opt.step()`` sums that optimizer's gradient over every device and process first, so N
devices train as one does on the whole batch. With Lightning installed the module is a real
``LightningModule`` (and trains the same under ``lightning.Trainer``); without it, an
``nn.Module`` with the same methods, which is all ``fit`` reads.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Optional

import torch
from torch import nn

import dptrain

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gan import GAN, LATENT, Score, arguments, bce, report, ring  # noqa: E402

if importlib.util.find_spec("lightning") is not None:
    from lightning import LightningModule as Base
else:                   # (fit reads the methods, not the class)
    Base = nn.Module


class LitGAN(GAN, Base):
    def __init__(self, lr: float = 1e-3):
        super().__init__()
        self.automatic_optimization = False
        self.lr = lr

    def training_step(self, batch, batch_idx):
        real = batch[0] if isinstance(batch, (list, tuple)) else batch
        opt_d, opt_g = self.optimizers()
        noise = torch.randn(len(real), LATENT, device=real.device)

        self.toggle_optimizer(opt_d)
        fake = self.generator(noise).detach()
        d_loss = bce(self.discriminator(real), 1.0) + bce(self.discriminator(fake), 0.0)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)

        self.toggle_optimizer(opt_g)
        g_loss = bce(self.discriminator(self.generator(noise)), 1.0)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.lr_schedulers().step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

    def configure_optimizers(self):
        adam = dict(lr=self.lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), **adam)
        opt_g = torch.optim.Adam(self.generator.parameters(), **adam)
        return [opt_d, opt_g], [torch.optim.lr_scheduler.ExponentialLR(opt_g, gamma=0.9999)]


def main(argv: Optional[List[str]] = None) -> dict:
    args = arguments(argv, __doc__)
    torch.manual_seed(0)
    model = LitGAN()
    return dptrain.fit(model, ring(args.samples, seed=1), callbacks=[Score()], batch_size=256, epochs=args.epochs,
                       devices=args.devices, checkpoint_dir=args.checkpoint_dir, resume=args.resume)


if __name__ == "__main__":
    report(main())
