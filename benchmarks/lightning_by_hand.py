"""Sessions 61-64's checks by hand against Lightning's own ``Trainer`` (Lightning is not installed in CI):
a LightningModule's ``configure_gradient_clipping`` and ``on_after_batch_transfer``, and a Lightning
``Callback`` of one's own, run under Lightning's ``Trainer`` and under ``dptrain.fit`` (2 devices).

    python3 -m venv /tmp/lt && . /tmp/lt/bin/activate && pip install torch==2.13.0 && \\
        pip install lightning==2.6.6 torch==2.13.0 pytest && pip install -e .
    python benchmarks/lightning_by_hand.py

Prints, for each, whether the hooks saw the same things in the same order and how far the
weights (or losses, predictions) are apart. Session 61 (Lightning 2.6.6, torch 2.13.0+cpu):
clipping calls equal, weights within 1.2e-7; transfer stages equal, weights 6e-8, test loss 4e-8,
predictions 8e-7; the callback's 44 calls equal, values within 1e-6. Session 62 (``eval_batch``): the
module's ``on_validation_batch_start/end`` in fit and ``on_test_batch_end`` in test, what they log and
keep for ``on_validation_epoch_end`` equal to Lightning's (float64, apart 0), dptrain on 2 devices; a
Lightning callback's ``on_validation_batch_start/end`` on the same batches, outputs' loss within 6e-17 (3
devices); ``before_transfer``: the module's ``on_before_batch_transfer``, the same stages and batch sizes,
weights within 1.1e-16 (float64, dptrain on 2 devices). Session 64 (``loader_order``): a training
``DataLoader(shuffle=False)`` given to both, ``fit`` given no ``shuffle=``: weights 4.7e-16 apart (float64,
dptrain on 2 devices; 0.38 before, when fit shuffled it). ``scheduler_order``: an epoch
StepLR's rate read at every batch end, in validation and the epoch-end hooks: the same 12 reads as
Lightning's (8 of them apart before, stepped after the hooks), and max_steps cutting an epoch short
leaves it unstepped in both. ``finetuning``: Lightning's ``BackboneFinetuning`` (SGD with
momentum) 4.4e-16 apart, a ``BaseFinetuning`` of one's own (a BatchNorm, Adam, ``sync_batchnorm``)
6.8e-11, each resumed after its unfreezing 0 from the unbroken run (dptrain on 2 devices; refused
before, and 0.54 apart in session 62, when its hooks did nothing). ``predict_hooks``: a module's
``on_predict_*`` hooks, the same 10 calls as ``trainer.predict``'s (1 device) and the same classes
written by ``on_predict_epoch_end`` (2 devices); not called before (a warning).
"""
from __future__ import annotations

import os
import sys

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dptrain  # noqa: E402

QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False, num_sanity_val_steps=0)


def weights(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def clipping() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(128, 6, generator=g) * 3
    y = (X[:, 0] > 0).long()

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net, self.calls = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)), []

        def training_step(self, batch, i):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
            self.calls.append((self.current_epoch, self.global_step, gradient_clip_val, gradient_clip_algorithm))
            if self.current_epoch >= 1:
                self.clip_gradients(optimizer, gradient_clip_val=0.05, gradient_clip_algorithm="norm")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
    for accumulate in (1, 2):
        a, b = M(), M()
        L.Trainer(max_epochs=2, accumulate_grad_batches=accumulate, **QUIET).fit(
            a, DataLoader(TensorDataset(X, y), batch_size=16))
        dptrain.fit(b, (X, y), epochs=2, batch_size=16, shuffle=False, log=None, progress=False, devices=2,
                    accumulate_grad_batches=accumulate)
        print(f"configure_gradient_clipping, accumulate {accumulate}: calls equal {a.calls == b.calls} "
              f"({len(a.calls)}), weights apart {float((weights(a) - weights(b)).abs().max()):.2g}")


def transfer() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g)
    y = (X[:, 0] > 0).long()

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net, self.calls = nn.Linear(4, 2), set()

        def forward(self, x):
            return self.net(x)

        def on_after_batch_transfer(self, batch, i):
            t = self.trainer
            self.calls.add((t.training, t.validating, t.testing, t.predicting, i))
            if t.predicting:
                return batch * 3
            x, y = batch
            return (x * 2 if t.training else x), y

        def training_step(self, b, i):
            return F.cross_entropy(self(b[0]), b[1])

        def validation_step(self, b, i):
            self.log("val_loss", F.cross_entropy(self(b[0]), b[1]))

        def test_step(self, b, i):
            self.log("test_loss", F.cross_entropy(self(b[0]), b[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)
    a, b = M(), M()
    trainer, loader = L.Trainer(max_epochs=2, **QUIET), DataLoader(TensorDataset(X, y), batch_size=16)
    trainer.fit(a, loader, loader)
    dptrain.fit(b, (X, y), (X, y), epochs=2, batch_size=16, shuffle=False, devices=2, log=None, progress=False)
    print(f"on_after_batch_transfer, fit: stages equal {sorted(a.calls) == sorted(b.calls)}, weights apart "
          f"{float((weights(a) - weights(b)).abs().max()):.2g}")
    a.calls.clear()
    b.calls.clear()
    la = trainer.test(a, loader, verbose=False)[0]["test_loss"]
    lb = dptrain.evaluate(b, (X, y), batch_size=16, devices=2)["test_loss"]
    print(f"... test: stages equal {sorted(a.calls) == sorted(b.calls)}, losses apart {abs(la - lb):.2g}")
    a.calls.clear()
    b.calls.clear()
    pa = torch.cat(trainer.predict(a, DataLoader(X, batch_size=16)))
    pb = dptrain.predict(b, X, batch_size=16, devices=2)
    print(f"... predict: stages equal {sorted(a.calls) == sorted(b.calls)}, outputs apart "
          f"{float((pa - pb).abs().max()):.2g}")


def callbacks() -> None:
    import tests.callbacks.test_lightning_callbacks as T

    class Recorder(L.Callback):      # the test's recorder, on Lightning's own Callback
        pass
    for name, fn in vars(T.Recorder).items():
        if callable(fn) and not name.startswith("__"):
            setattr(Recorder, name, fn)

    class Module(L.LightningModule):
        def __init__(self, calls=None):
            super().__init__()
            torch.manual_seed(0)
            self.net, self.calls = nn.Linear(4, 2).double(), calls
    for name in ("training_step", "validation_step", "on_train_epoch_end", "configure_optimizers"):
        setattr(Module, name, vars(T.Module)[name])
    X, y = T.data()
    runs = []
    for framework in ("lightning", "dptrain"):
        calls = []
        cb, m = Recorder(), Module(calls)
        cb.calls = calls
        if framework == "lightning":
            L.Trainer(max_epochs=2, callbacks=[cb], **QUIET).fit(
                m, DataLoader(TensorDataset(X, y), batch_size=16), DataLoader(TensorDataset(X, y), batch_size=64))
        else:
            dptrain.fit(m, (X, y), (X, y), epochs=2, batch_size=16, devices=2, shuffle=False, callbacks=[cb],
                        progress=False, log=None, eval_batch_size=64)
        runs.append(calls)
    a, b = runs
    close = all(x[:-1] == z[:-1] and (x[-1] == z[-1] or (isinstance(x[-1], float) and
                                                        abs(x[-1] - z[-1]) <= 1e-6 * abs(x[-1])))
                for x, z in zip(a, b))
    print(f"a Lightning Callback: {len(a)} and {len(b)} calls, in order and within 1e-6: {close and len(a) == len(b)}")


def eval_batch() -> None:
    """Session 62: the module's on_validation_batch_start/end (on_test_batch_end in test): what they
    log and keep, Lightning's (1 device, no sanity check) against dptrain's on 2 devices."""
    import tests.engine.test_lightning_eval_batch as T

    def on(base):
        class M(L.LightningModule):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.net, self.probs = nn.Linear(4, 2).double(), []
        for name, fn in {**vars(T.Hooked), **vars(base)}.items():
            if callable(fn) and not name.startswith("__") and name not in ("trainer",):
                setattr(M, name, fn)
        return M
    X, y = T.data()
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    for base, stage in ((T.Hooked, "fit"), (T.Tested, "test")):
        M = on(base)
        a, b = M(), M()
        T.Hooked.calls = []
        trainer = L.Trainer(max_epochs=1, **QUIET)
        trainer.fit(a, loader, loader)
        if stage == "test":
            T.Hooked.calls = []
            la = {k: float(v) for k, v in trainer.test(a, loader, verbose=False)[0].items()}
        else:
            la = {k: float(v) for k, v in trainer.callback_metrics.items()}
        calls_a = sorted(T.Hooked.calls)
        T.Hooked.calls = []
        result = dptrain.fit(b, (X, y), (X, y), epochs=1, batch_size=16, shuffle=False, devices=2, log=None,
                             progress=False)
        if stage == "test":
            T.Hooked.calls = []
            lb = dptrain.evaluate(b, (X, y), batch_size=16, devices=2)
        else:
            lb = {"val_" + k[5:]: v for k, v in result["history"][-1].items() if k.startswith("test_")}
        # (dptrain's calls: each device's part, after the one-sample check; Lightning's: each batch)
        parts = [c for c in T.Hooked.calls if c[2] == 8]
        names = [k for k in la if k in lb or k.replace("val_", "test_") in lb]
        apart = max(abs(la[k] - lb.get(k, lb.get(k.replace("val_", "test_"), float("nan")))) for k in names)
        print(f"on_{'validation' if stage == 'fit' else 'test'}_batch_*, {stage}: figures {sorted(names)} apart "
              f"{apart:.2g}; batches {sorted({c[1] for c in calls_a})} (Lightning), each device's "
              f"{sorted({c[1] for c in parts})} x {len(parts) // max(1, len({c[1] for c in parts}))} (dptrain)")

    import tests.callbacks.test_lightning_callbacks as C

    class Recorder(L.Callback):         # (the test's, on Lightning's own Callback)
        on_validation_batch_start = C.EvalRecorder.on_validation_batch_start
        on_validation_batch_end = C.EvalRecorder.on_validation_batch_end

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(4, 2).double()
    for name in ("training_step", "validation_step", "configure_optimizers"):
        setattr(Module, name, vars(C.Probs).get(name) or vars(C.Module)[name])
    X, y = C.data()
    runs = []
    for framework in ("lightning", "dptrain"):
        C.ORDER.clear()
        if framework == "lightning":
            L.Trainer(max_epochs=1, callbacks=[Recorder()], **QUIET).fit(
                Module(), DataLoader(TensorDataset(X, y), batch_size=16), DataLoader(TensorDataset(X, y), batch_size=16))
        else:
            dptrain.fit(Module(), (X, y), (X, y), epochs=1, batch_size=16, devices=3, shuffle=False,
                        callbacks=[Recorder()], progress=False, log=None)
        runs.append(list(C.ORDER))
    a, b = runs
    apart = max(abs(x[2] - z[2]) for x, z in zip(a, b) if x[0] == "end")
    print(f"a Lightning Callback's on_validation_batch_start/end: {len(a)} and {len(b)} calls, the same batches "
          f"{[x[:2] for x in a] == [z[:2] for z in b]}, outputs' loss apart {apart:.2g} (dptrain on 3 devices: "
          f"the parts' outputs joined)")


def before_transfer() -> None:
    """Session 62: the module's on_before_batch_transfer (uint8 batches made float): the stages it
    sees and the weights, Lightning's (1 device) against dptrain's on 2 devices."""
    import tests.engine.test_lightning_transfer as T

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(4, 2).double()
    for name in ("forward", "on_before_batch_transfer", "training_step", "validation_step", "configure_optimizers"):
        setattr(M, name, vars(T.Scaled)[name])
    X, y = T.scaled()
    a, b = M(), M()
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    T.Scaled.calls = []
    L.Trainer(max_epochs=2, **QUIET).fit(a, loader, loader)
    calls_a = sorted(set(T.Scaled.calls))
    T.Scaled.calls = []
    dptrain.fit(b, (X, y), (X, y), epochs=2, batch_size=16, shuffle=False, devices=2, log=None, progress=False)
    calls_b = sorted(set(c for c in T.Scaled.calls if c[1] != 1))       # (dptrain's one-sample checks)
    print(f"on_before_batch_transfer, fit: stages and batch sizes equal {calls_a == calls_b} ({calls_a}), weights "
          f"apart {float((weights(a) - weights(b)).abs().max()):.2g}")


def test_hooks() -> None:
    """Session 62: the module's on_test_start ... on_test_epoch_end ... on_test_end in trainer.test
    against dptrain.evaluate on 2 devices: the calls, and what on_test_epoch_end logs over the kept hits."""
    import tests.engine.test_lightning_test_hooks as T

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net, self.hits, self.calls = nn.Linear(4, 2).double(), [], []
    for name, fn in {**vars(T.TestHooks), **vars(T.Tested)}.items():
        if name.startswith(("on_test", "test_step", "training_step")):
            setattr(M, name, fn)
    M.configure_optimizers = lambda self: torch.optim.SGD(self.parameters(), lr=0.1)
    X, y = T.data()
    a, b = M(), M()
    got_a = L.Trainer(**QUIET).test(a, DataLoader(TensorDataset(X, y), batch_size=16), verbose=False)[0]
    got_b = dptrain.evaluate(b, (X, y), batch_size=16, devices=2)
    names = sorted(k for k in got_a if k in got_b)
    apart = max(abs(float(got_a[k]) - got_b[k]) for k in names)
    print(f"on_test_*, test: calls equal {[c[0] for c in a.calls] == [c[0] for c in b.calls]}, figures {names} "
          f"apart {apart:.2g} (dptrain on 2 devices)")


def ema() -> None:
    """Session 62: Lightning's EMAWeightAveraging under Lightning's Trainer (1 device) and taken as
    dptrain's LightningEMA (2 devices): each epoch's val_loss on the average, the final weights."""
    from lightning.pytorch.callbacks import EMAWeightAveraging
    import tests.callbacks.test_weight_averaging as T

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = T.made()
    for name in ("training_step", "validation_step", "configure_optimizers"):
        setattr(M, name, vars(T.Lit)[name])
    X, y = T.data()
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    for settings in ({"decay": 0.9}, {"decay": 0.8, "update_every_n_steps": 2, "update_starting_at_step": 3},
                     {"decay": 0.7, "update_starting_at_epoch": 1}):
        a, b, losses = M(), M(), []

        class Losses(L.Callback):
            def on_validation_epoch_end(self, trainer, module):
                losses.append(float(trainer.callback_metrics["val_loss"]))
        L.Trainer(max_epochs=3, callbacks=[EMAWeightAveraging(**settings), Losses()], **QUIET).fit(a, loader, loader)
        rows = dptrain.fit(b, (X, y), (X, y), epochs=3, batch_size=16, devices=2, shuffle=False, log=None,
                           progress=False, callbacks=[EMAWeightAveraging(**settings)])["history"]
        apart = max(abs(x - row["test_loss"]) for x, row in zip(losses, rows))
        print(f"EMAWeightAveraging({settings}): val_loss apart {apart:.2g}, weights apart "
              f"{float((weights(a) - weights(b)).abs().max()):.2g} (dptrain on 2 devices)")


def loader_order() -> None:
    """A training ``DataLoader(shuffle=False)`` given to both, no ``shuffle=`` to dptrain: its order kept."""
    g = torch.Generator().manual_seed(4)
    X = torch.randn(96, 5, generator=g, dtype=torch.float64)
    y = X[:, 1] - X[:, 3]

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)).double()

        def training_step(self, batch, i):
            return F.mse_loss(self.net(batch[0]).squeeze(-1), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    loader = DataLoader(TensorDataset(X, y), batch_size=16, shuffle=False)
    a, b = M(), M()
    L.Trainer(max_epochs=3, **QUIET).fit(a, loader)
    dptrain.fit(b, loader, epochs=3, devices=2, log=None, progress=False)
    print(f"DataLoader(shuffle=False), fit given no shuffle=: weights apart "
          f"{float((weights(a) - weights(b)).abs().max()):.2g} (dptrain on 2 devices)")


def scheduler_order() -> None:
    """The rate a module reads at the epoch's last batch end, in validation and its epoch-end hooks,
    its StepLR stepped every epoch (Lightning steps it after the last update); then max_steps cutting
    the second epoch short (not stepped there)."""
    g = torch.Generator().manual_seed(5)
    X = torch.randn(48, 6, generator=g)
    y = (X[:, 0] > 0).long()

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net, self.seen = nn.Linear(6, 2), []

        def _read(self, where):
            self.seen.append((where, self.current_epoch, self.optimizers().param_groups[0]["lr"]))

        def training_step(self, batch, i):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def on_train_batch_end(self, outputs, batch, i):
            self._read(f"batch_end {i}")

        def validation_step(self, batch, i):
            if i == 0:
                self._read("validation_step")
            self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

        def on_validation_epoch_end(self):
            self._read("on_validation_epoch_end")

        def on_train_epoch_end(self):
            self._read("on_train_epoch_end")

        def configure_optimizers(self):
            self.made = torch.optim.SGD(self.parameters(), lr=0.2)
            return {"optimizer": self.made, "lr_scheduler": torch.optim.lr_scheduler.StepLR(self.made, 1, 0.5)}

    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    a, b = M(), M()
    L.Trainer(max_epochs=2, **QUIET).fit(a, loader, loader)
    dptrain.fit(b, loader, loader, epochs=2, devices=1, log=None, progress=False)
    c, d = M(), M()
    L.Trainer(max_epochs=2, max_steps=4, **QUIET).fit(c, loader)
    dptrain.fit(d, loader, epochs=2, max_steps=4, devices=1, log=None, progress=False)
    print(f"StepLR's steps: {len(a.seen)} reads, equal: {a.seen == b.seen}; max_steps=4 of 2 epochs of 3: rates "
          f"{c.made.param_groups[0]['lr']:g} / {d.made.param_groups[0]['lr']:g} (dptrain on 1 device)")


def finetuning() -> None:
    """Lightning's BackboneFinetuning, and a BaseFinetuning of one's own as Lightning's docs write it
    (a BatchNorm in the backbone, Adam), under Lightning's Trainer and dptrain.fit (2 devices, the
    BatchNorm synchronized); dptrain's run stopped after the unfreezing and resumed."""
    import tempfile

    from lightning.pytorch.callbacks import BackboneFinetuning, BaseFinetuning

    class Mine(BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone)

        def finetune_function(self, pl_module, epoch, optimizer):
            if epoch == 2:
                self.unfreeze_and_add_param_group(modules=pl_module.backbone, optimizer=optimizer, train_bn=True)

    g = torch.Generator().manual_seed(6)
    X = torch.randn(64, 4, generator=g, dtype=torch.float64)
    y = (X[:, 0] > 0).long()

    class M(L.LightningModule):
        def __init__(self, adam):
            super().__init__()
            torch.manual_seed(0)
            self.adam = adam
            self.backbone = nn.Sequential(nn.Linear(4, 8), *([nn.BatchNorm1d(8)] if adam else []), nn.Tanh()).double()
            self.head = nn.Linear(8, 2).double()

        def training_step(self, batch, i):
            return F.cross_entropy(self.head(self.backbone(batch[0])), batch[1])

        def validation_step(self, batch, i):
            self.log("val_loss", F.cross_entropy(self.head(self.backbone(batch[0])), batch[1]))

        def configure_optimizers(self):
            trained = [p for p in self.parameters() if p.requires_grad]
            return torch.optim.Adam(trained, lr=0.05) if self.adam else torch.optim.SGD(trained, lr=0.5, momentum=0.9)

    def every(m):
        return torch.cat([t.detach().reshape(-1).double() for t in m.state_dict().values() if t.is_floating_point()])

    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    for name, make, adam in [("BackboneFinetuning(1, 0.1)", lambda: BackboneFinetuning(1, backbone_initial_ratio_lr=0.1),
                              False), ("a BaseFinetuning of one's own", Mine, True)]:
        a, b, c = M(adam), M(adam), M(adam)
        L.Trainer(max_epochs=4, callbacks=[make()], **QUIET).fit(a, loader, loader)
        settings = dict(devices=2, log=None, progress=False, sync_batchnorm=adam)
        dptrain.fit(b, loader, loader, epochs=4, callbacks=[make()], **settings)
        with tempfile.TemporaryDirectory() as d:
            dptrain.fit(M(adam), loader, loader, epochs=3, callbacks=[make()], checkpoint_dir=d, **settings)
            dptrain.fit(c, loader, loader, epochs=4, callbacks=[make()], checkpoint_dir=d, resume=True, **settings)
        print(f"{name}: weights and statistics apart {float((every(a) - every(b)).abs().max()):.2g}, resumed against "
              f"unbroken {float((every(b) - every(c)).abs().max()):.2g} (dptrain on 2 devices)")


def predict_hooks() -> None:
    """A module's on_predict_* hooks under Lightning's trainer.predict and dptrain.predict: the calls (1 device),
    what on_predict_batch_end kept and on_predict_epoch_end wrote (2 devices)."""
    X = torch.randn(40, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net, self.kept, self.calls, self.written = nn.Linear(4, 3).double(), [], [], None

        def predict_step(self, batch, i):
            return self.net(batch)

        def on_predict_start(self):
            self.calls.append("start")

        def on_predict_epoch_start(self):
            self.calls.append("epoch_start")

        def on_predict_batch_start(self, batch, i):
            self.calls.append(("batch_start", i, len(batch)))

        def on_predict_batch_end(self, outputs, batch, i):
            self.kept.append(outputs.argmax(1))
            self.calls.append(("batch_end", i, len(outputs)))

        def on_predict_epoch_end(self):
            self.written = torch.cat(self.kept)
            self.calls.append("epoch_end")

        def on_predict_end(self):
            self.calls.append("end")

    a, b, c = M(), M(), M()
    L.Trainer(**QUIET).predict(a, DataLoader(X, batch_size=16))
    dptrain.predict(b, X, batch_size=16, devices=1)
    dptrain.predict(c, X, batch_size=16, devices=2)
    print(f"on_predict_*: calls equal {a.calls == b.calls} ({len(a.calls)}, dptrain on 1 device); written equal "
          f"{torch.equal(a.written, c.written)} (dptrain on 2 devices)")


if __name__ == "__main__":
    predict_hooks()
    finetuning()
    scheduler_order()
    loader_order()
    clipping()
    transfer()
    callbacks()
    eval_batch()
    before_transfer()
    test_hooks()
    ema()
