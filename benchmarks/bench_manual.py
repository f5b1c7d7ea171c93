"""What a LightningModule's manual optimization costs: the plain loop of a GAN (two optimizers
stepped in turn on each batch) against ``fit`` of the same program written as Lightning 2 writes
it (``automatic_optimization = False``, ``self.optimizers()``, ``self.manual_backward``), and
against ``fit`` of it as dptrain's steps taking turns (``step={...}``, ``optimizer={...}``).

    python benchmarks/bench_manual.py --rounds 7 --out benchmarks/results/manual.json
    python benchmarks/bench_manual.py --smoke

The program: ``everyday.py``'s GAN (generator and discriminator MLPs of 128 units) on points of a
ring of 8 Gaussians (16,384, batch 256: 64 steps an epoch), Adam(2e-4, betas (0.5, 0.999)) each,
the discriminator's step first (real and detached fake), then the generator's. A figure is one
whole training call's wall seconds; the variants take turns each round, the order rotating;
ratios are paired (the same round), medians over the rounds. ``--devices 1,2``: fit's variants
on each (2: two virtual CPU devices, whose manual copies run in turn). Where Lightning is
installed, its ``Trainer`` on one CPU device trains the same module too (``--no-lightning``: not).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dptrain  # noqa: E402
import everyday  # noqa: E402
from common import in_turns, paired, rounds_parser, save_result  # noqa: E402

BATCH, ADAM = 256, dict(lr=2e-4, betas=(0.5, 0.999))


class ManualGAN(everyday.RingGAN):
    """The GAN as a LightningModule with manual optimization writes its step."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt_d, opt_g = self.optimizers()
        d_loss = everyday.gan_d_step(self, batch)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        g_loss = everyday.gan_g_step(self, batch)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        opt_d.zero_grad()           # (the generator's loss left the discriminator a gradient)
        return d_loss + g_loss

    def configure_optimizers(self):
        return [torch.optim.Adam(self.discriminator.parameters(), **ADAM),
                torch.optim.Adam(self.generator.parameters(), **ADAM)]


def made(kind):
    torch.manual_seed(0)
    return ManualGAN() if kind == "manual" else everyday.RingGAN()


def plain(data, epochs):
    start = time.perf_counter()
    gan = made("plain")
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), **ADAM)
    opt_g = torch.optim.Adam(gan.generator.parameters(), **ADAM)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=BATCH, shuffle=True)
    for _ in range(epochs):
        for (real,) in loader:
            everyday.gan_d_step(gan, real).backward()
            opt_d.step()
            opt_d.zero_grad()
            everyday.gan_g_step(gan, real).backward()
            opt_g.step()
            opt_g.zero_grad()
            gan.discriminator.zero_grad()
    return time.perf_counter() - start


def lightning_fitted(data, epochs):
    """Lightning's own Trainer on one CPU device, the module as it is, a DataLoader as above."""
    import lightning

    class LitGAN(ManualGAN, lightning.LightningModule):
        pass
    start = time.perf_counter()
    torch.manual_seed(0)
    trainer = lightning.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=BATCH, shuffle=True)
    trainer.fit(LitGAN(), loader)
    return time.perf_counter() - start


def fitted(data, epochs, kind, devices):
    start = time.perf_counter()
    gan = made(kind)
    steps = {} if kind == "manual" else dict(
        step={"discriminator": everyday.gan_d_step, "generator": everyday.gan_g_step},
        optimizer={"discriminator": torch.optim.Adam(gan.discriminator.parameters(), **ADAM),
                   "generator": torch.optim.Adam(gan.generator.parameters(), **ADAM)})
    dptrain.fit(gan, (data,), epochs=epochs, batch_size=BATCH, devices=devices, log=None, progress=False, **steps)
    return time.perf_counter() - start


def main() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)      # (its tips and summaries)
    parser = rounds_parser(__doc__, 16_384)
    parser.add_argument("--devices", default="1")
    parser.add_argument("--no-lightning", action="store_true")
    args = parser.parse_args()
    rounds, epochs, samples = (1, 1, 1024) if args.smoke else (args.rounds, args.epochs, args.samples)
    data = everyday.ring(samples)
    variants = {"plain": lambda: plain(data, epochs)}
    for d in args.devices.split(","):
        variants[f"fit, manual, {d} device"] = lambda d=d: fitted(data, epochs, "manual", int(d))
        variants[f"fit, steps in turn, {d} device"] = lambda d=d: fitted(data, epochs, "turns", int(d))
    if not args.no_lightning and importlib.util.find_spec("lightning") is not None:
        variants["lightning Trainer, manual, 1 device"] = lambda: lightning_fitted(data, epochs)
    for fn in variants.values():        # a warm-up call each (first-call costs of torch's kernels)
        fn()
    raw = in_turns(variants, rounds)
    speed = {k: [1 / s for s in v] for k, v in raw.items()}       # (paired takes rates: higher is faster)
    figures = {"seconds": {k: statistics.median(v) for k, v in raw.items()},
               "x plain (speed)": {k: paired(speed, k, "plain") for k in variants if k != "plain"}, "raw": raw}
    command = "python benchmarks/bench_manual.py " + " ".join(sys.argv[1:])
    save_result({"rounds": rounds, "epochs": epochs, "samples": samples, **figures}, command, args.out)


if __name__ == "__main__":
    main()
