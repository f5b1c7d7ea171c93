"""One LightningModule trained three ways on one device: a plain loop over its training_step,
dptrain.fit(module, ...) and Lightning's Trainer.fit (when lightning is installed): seconds an
epoch, variants taking turns epoch by epoch (turns.py), medians of paired ratios to the plain loop.

The module is a tiny MLP (32-64-4, batch 128, tensors in memory: everyday.tiny_data), whose
step is mostly host work, and its validation_step logs val_loss and val_acc. The plain loop
and dptrain read the samples through a DataLoader-free path of their own; Lightning reads a
DataLoader (its way). Set-up and the evaluation are outside the epochs' clocks. With
``--log-train`` its training_step also logs train_loss and train_acc (on_epoch=True), as most
Lightning programs do (the plain loop calls LightningModule.log, which does nothing there
without a Trainer; dptrain records them, each epoch's train_acc). With ``--batch-hook`` the
module also keeps a target copy of its MLP, which its ``on_train_batch_end`` moves towards the
trained one after each update (a momentum encoder's habit; the plain loop calls the hook). With
``--grad-norm`` its ``on_before_optimizer_step`` logs each parameter's gradient norm and the
total (Lightning's documented ``self.log_dict(grad_norm(self, norm_type=2))``, by hand): the
plain loop calls it between backward and step (its log does nothing), dptrain and Lightning
log every 50 steps (Lightning's default ``log_every_n_steps``; dptrain copies each update's
gradients for the hook). Session 61's hooks: ``--clip-hook``, its ``configure_gradient_clipping``
asks ``self.clip_gradients(optimizer, 1.0, "norm")`` (the plain loop clips with
``clip_grad_norm_`` between backward and step); ``--transfer-hook``, its
``on_after_batch_transfer`` gives the batch back (the plain loop calls it on each batch);
``--callback``, a Lightning ``Callback`` of one's own counts the batches in its
``on_train_batch_end`` (the plain loop calls it after each step; without Lightning installed, a
class of Lightning's ``Callback``'s shape).

    python benchmarks/bench_lightning.py --rounds 5 --epochs 4 [--log-train] [--batch-hook] [--grad-norm]
        [--clip-hook] [--transfer-hook] [--callback]
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import everyday  # noqa: E402
from common import rounds_parser, save_result  # noqa: E402
from turns import take_turns  # noqa: E402

BATCH = 128


#: Whether training_step logs its loss and accuracy (--log-train), as most Lightning programs do.
LOG_TRAIN = "--log-train" in sys.argv
#: Whether the module has an on_train_batch_end (--batch-hook): a momentum update of a target copy.
BATCH_HOOK = "--batch-hook" in sys.argv
#: Whether the module logs its gradients' norms in on_before_optimizer_step (--grad-norm).
GRAD_NORM = "--grad-norm" in sys.argv
#: Session 61's hooks: its own configure_gradient_clipping, on_after_batch_transfer, a Lightning callback.
CLIP_HOOK, TRANSFER_HOOK, CALLBACK = ("--clip-hook" in sys.argv, "--transfer-hook" in sys.argv,
                                      "--callback" in sys.argv)


def _counter():
    """A Lightning ``Callback`` of one's own counting the batches (``--callback``)."""
    try:
        from lightning import Callback as Base
    except ImportError:
        class Callback:             # (Lightning's base Callback's shape: its name, its module's, a no-op hook)
            __module__ = "lightning.pytorch.callbacks.callback"

            def on_fit_start(self, trainer, pl_module):
                pass
        Base = Callback

    class Count(Base):
        batches = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1
    return Count()


def _module_class():
    """The LightningModule (built on lightning's class when it is installed, so the Trainer
    takes it; dptrain reads only its methods)."""
    try:
        from lightning import LightningModule as Base
    except ImportError:
        class Base(nn.Module):
            def log(self, *args, **kwargs):         # (LightningModule's without a Trainer: nothing)
                pass

            def log_dict(self, *args, **kwargs):
                pass

    class Lit(Base):
        def __init__(self):
            super().__init__()
            self.net = everyday.tiny_mlp()
            if BATCH_HOOK:
                self.target = everyday.tiny_mlp().requires_grad_(False)

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            loss = F.cross_entropy(logits, y)
            if LOG_TRAIN:
                self.log("train_loss", loss)
                self.log("train_acc", (logits.argmax(1) == y).float().mean(), on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.log("val_loss", F.cross_entropy(logits, y))
            self.log("val_acc", (logits.argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.net.parameters(), lr=0.05)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            torch._foreach_lerp_(list(self.target.parameters()), list(self.net.parameters()), 0.01)
    def on_before_optimizer_step(self, optimizer):
        each = {f"grad_2.0_norm/{n}": p.grad.norm() for n, p in self.named_parameters() if p.grad is not None}
        self.log_dict({**each, "grad_2.0_norm_total": torch.stack(list(each.values())).norm()})
    def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
        self.clip_gradients(optimizer, gradient_clip_val=1.0, gradient_clip_algorithm="norm")

    def on_after_batch_transfer(self, batch, dataloader_idx):
        return batch
    if BATCH_HOOK:
        Lit.on_train_batch_end = on_train_batch_end
    if GRAD_NORM:
        Lit.on_before_optimizer_step = on_before_optimizer_step
    if CLIP_HOOK:
        Lit.configure_gradient_clipping = configure_gradient_clipping
    if TRANSFER_HOOK:
        Lit.on_after_batch_transfer = on_after_batch_transfer
    return Lit


def _data(samples):
    X, y = everyday.tiny_data(samples)
    return X, y


def run_plain(samples, epochs, gate=None):
    torch.manual_seed(0)
    model = _module_class()()
    opt = model.configure_optimizers()
    X, y = _data(samples)
    times, counter = [], _counter() if CALLBACK else None
    for _ in range(epochs):
        if gate is not None:
            gate()
        t = time.perf_counter()
        perm = torch.randperm(len(X))
        for i, start in enumerate(range(0, len(X), BATCH)):
            idx = perm[start:start + BATCH]
            batch = (X[idx], y[idx])
            if TRANSFER_HOOK:
                batch = model.on_after_batch_transfer(batch, 0)
            loss = model.training_step(batch, i)
            opt.zero_grad()
            loss.backward()
            if GRAD_NORM:
                model.on_before_optimizer_step(opt)
            if CLIP_HOOK:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if BATCH_HOOK:
                model.on_train_batch_end({"loss": loss.detach()}, batch, i)
            if counter is not None:
                counter.on_train_batch_end(None, model, {"loss": loss.detach()}, batch, i)
        times.append(time.perf_counter() - t)
    return {"epochs": times}


def run_dptrain(samples, epochs, gate=None):
    import dptrain
    torch.manual_seed(0)
    model = _module_class()()

    class Gate(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            if gate is not None:
                gate()
    X, y = _data(samples)
    result = dptrain.fit(model, (X, y), (X[:1024], y[:1024]), epochs=epochs, batch_size=BATCH, devices=1,
                         log=None, progress=False, callbacks=[Gate()] + ([_counter()] if CALLBACK else []),
                         **({"log_every_n_steps": 50} if GRAD_NORM else {}))
    return {"epochs": [row["sec"] for row in result["history"]], "test_acc": result["test_acc"]}


class _Clock:
    """Lightning's side: a Callback timing each training epoch (gate before its clock)."""

    def __new__(cls, gate):
        from lightning import Callback

        class Clock(Callback):
            def __init__(self):
                self.times, self.t, self.last = [], 0.0, 0.0

            def on_train_epoch_start(self, trainer, module):
                if gate is not None:
                    gate()
                self.t = time.perf_counter()

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                self.last = time.perf_counter()

            def on_train_epoch_end(self, trainer, module):       # (its last batch's end: not the validation)
                self.times.append(self.last - self.t)
        return Clock()


def run_lightning(samples, epochs, gate=None):
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    model = _module_class()()
    X, y = _data(samples)
    train = DataLoader(TensorDataset(X, y), batch_size=BATCH, shuffle=True)
    val = DataLoader(TensorDataset(X[:1024], y[:1024]), batch_size=BATCH)
    clock = _Clock(gate)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[clock] + ([_counter()] if CALLBACK else []))
    trainer.fit(model, train, val)
    return {"epochs": clock.times, "test_acc": float(trainer.callback_metrics["val_acc"])}


def main():
    parser = rounds_parser(__doc__, samples=25_600)
    parser.add_argument("--log-train", action="store_true",
                        help="training_step logs train_loss and train_acc (on_epoch=True)")
    parser.add_argument("--batch-hook", action="store_true",
                        help="the module's on_train_batch_end moves a target copy towards the trained MLP")
    parser.add_argument("--grad-norm", action="store_true",
                        help="the module's on_before_optimizer_step logs its gradients' norms")
    parser.add_argument("--clip-hook", action="store_true",
                        help="the module's configure_gradient_clipping clips the norm to 1.0")
    parser.add_argument("--transfer-hook", action="store_true",
                        help="the module's on_after_batch_transfer gives each batch back")
    parser.add_argument("--callback", action="store_true",
                        help="a Lightning Callback of one's own counts the batches in on_train_batch_end")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.epochs, args.samples = 1, 2, 1_024
    try:
        import lightning  # noqa: F401 (installed: its Trainer is a variant)
        variants = ("plain", "dptrain", "lightning")
    except ImportError:
        variants = ("plain", "dptrain")
    runners = {"plain": run_plain, "dptrain": run_dptrain, "lightning": run_lightning}
    steps = -(-args.samples // BATCH)
    ratios = {name: [] for name in variants if name != "plain"}
    us = {name: [] for name in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        got = take_turns({name: (runners[name], (args.samples, args.epochs)) for name in order})
        for name in variants:       # (the first epoch warms up)
            us[name] += [t / steps * 1e6 for t in got[name]["epochs"][1:]]
        for name in ratios:
            ratios[name] += [p / t for p, t in zip(got["plain"]["epochs"][1:], got[name]["epochs"][1:])]
    figures = {"us_per_step": {k: round(statistics.median(v), 1) for k, v in us.items()},
               "vs_plain": {k: round(statistics.median(v), 3) for k, v in ratios.items()},
               "rounds": args.rounds, "epochs": args.epochs, "samples": args.samples}
    save_result(figures, " ".join(["python"] + sys.argv), args.out)


if __name__ == "__main__":
    main()
