"""Lightning Callbacks of one's own beside a LightningModule: their hooks called with the module's
trainer and the module, where and in the order Lightning's Trainer calls them
(callbacks/lightning_callbacks.py). Lightning is not installed in CI: ``LCallback`` carries its
Callback's module name and no-op hooks."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dptrain
from tests.engine.test_lightning_module import LightningLike


class LCallback:
    """Lightning's ``Callback``: every hook a no-op taking (trainer, pl_module, ...). (Lightning's own: the
    same calls, checked by benchmarks/lightning_by_hand.py.)"""
    __module__ = "lightning.pytorch.callbacks.callback"

    def setup(self, trainer, pl_module, stage):
        pass

    def teardown(self, trainer, pl_module, stage):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


LCallback.__name__ = LCallback.__qualname__ = "Callback"       # (Lightning's base: its hooks are no-ops)


def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long()


class Module(LightningLike):
    def __init__(self, calls=None):
        super().__init__()
        torch.manual_seed(0)
        self.net, self.calls = nn.Linear(4, 2).double(), calls

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def on_train_epoch_end(self):
        if self.calls is not None:
            self.calls.append(("module on_train_epoch_end", self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class Recorder(LCallback):
    """What each hook saw, in order."""

    def __init__(self, calls):
        self.calls = calls

    def setup(self, trainer, pl_module, stage):
        self.calls.append(("setup", stage, trainer.lightning_module is pl_module))

    def on_fit_start(self, trainer, pl_module):
        self.calls.append(("on_fit_start",))

    def on_train_start(self, trainer, pl_module):
        self.calls.append(("on_train_start",))

    def on_train_epoch_start(self, trainer, pl_module):
        self.calls.append(("on_train_epoch_start", trainer.current_epoch))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.calls.append(("on_train_batch_start", batch_idx, trainer.global_step, len(batch[0])))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in pl_module.parameters()))
        self.calls.append(("on_before_optimizer_step", trainer.global_step, round(float(norm), 12)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.calls.append(("on_train_batch_end", batch_idx, trainer.global_step, round(float(outputs["loss"]), 12)))

    def on_validation_start(self, trainer, pl_module):
        self.calls.append(("on_validation_start", trainer.current_epoch))

    def on_validation_end(self, trainer, pl_module):
        self.calls.append(("on_validation_end", trainer.current_epoch))

    def on_validation_epoch_start(self, trainer, pl_module):
        self.calls.append(("on_validation_epoch_start", trainer.current_epoch))

    def on_validation_epoch_end(self, trainer, pl_module):
        val = float(trainer.callback_metrics["val_loss"])
        pl_module.log("cb_twice", 2 * val)
        self.calls.append(("on_validation_epoch_end", trainer.current_epoch, round(val, 12)))

    def on_train_epoch_end(self, trainer, pl_module):
        self.calls.append(("on_train_epoch_end", trainer.current_epoch))

    def on_train_end(self, trainer, pl_module):
        self.calls.append(("on_train_end",))

    def on_fit_end(self, trainer, pl_module):
        self.calls.append(("on_fit_end",))

    def teardown(self, trainer, pl_module, stage):
        self.calls.append(("teardown", stage))


def plain():
    """The plain loop's per-update gradient norms, losses and epochs' validation losses."""
    model, (X, y) = Module(), data()
    opt = model.configure_optimizers()
    norms, losses, vals = [], [], []
    for epoch in range(2):
        for b in range(4):
            loss = F.cross_entropy(model.net(X[b * 16:(b + 1) * 16]), y[b * 16:(b + 1) * 16])
            loss.backward()
            norms.append(round(float(torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))), 12))
            losses.append(round(float(loss.detach()), 12))
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            vals.append(round(float(F.cross_entropy(model.net(X), y)), 12))
    return norms, losses, vals


@pytest.mark.parametrize("devices", [1, 2])
def test_a_lightning_callbacks_hooks_run_where_and_in_the_order_lightnings_trainer_calls_them(devices):
    calls, lines = [], []
    norms, losses, vals = plain()
    result = dptrain.fit(Module(calls), data(), data(), epochs=2, batch_size=16, devices=devices, shuffle=False,
                         callbacks=[Recorder(calls)], progress=False, log=lines.append, eval_batch_size=64)
    want = [("setup", "fit", True), ("on_fit_start",), ("on_train_start",)]
    for epoch in range(2):
        want.append(("on_train_epoch_start", epoch))
        for b in range(4):
            step = epoch * 4 + b
            want += [("on_train_batch_start", b, step, 16), ("on_before_optimizer_step", step, norms[step]),
                     ("on_train_batch_end", b, step + 1, losses[step])]
        want += [("on_validation_start", epoch), ("on_validation_epoch_start", epoch),
                 ("on_validation_epoch_end", epoch, vals[epoch]), ("on_validation_end", epoch),
                 ("on_train_epoch_end", epoch), ("module on_train_epoch_end", epoch)]   # (the callback's first)
    want += [("on_train_end",), ("on_fit_end",), ("teardown", "fit")]
    got = [c if c[0] not in ("on_before_optimizer_step", "on_train_batch_end", "on_validation_epoch_end")
           else c[:-1] + (pytest.approx(c[-1], rel=1e-7),) for c in calls]
    assert got == want
    assert [row["test_cb_twice"] for row in result["history"]] == pytest.approx([2 * v for v in vals], rel=1e-6)  # (a float32, as Lightning logs)
    assert "dptrain: callback Recorder (a Lightning Callback) runs with the module's trainer, its hooks called where " \
           "Lightning's Trainer calls them" in lines


def test_should_stop_and_a_callbacks_state_across_a_resume(tmp_path):
    class CountAndStop(LCallback):
        def __init__(self, stop_at=None):
            self.epochs, self.stop_at = 0, stop_at

        def on_train_epoch_end(self, trainer, pl_module):
            self.epochs += 1
            if trainer.current_epoch == self.stop_at:
                trainer.should_stop = True

        def state_dict(self):
            return {"epochs": self.epochs}

        def load_state_dict(self, state):
            self.epochs = state["epochs"]

    stopping = CountAndStop(stop_at=1)
    result = dptrain.fit(Module(), data(), epochs=5, batch_size=16, callbacks=[stopping], progress=False, log=None)
    assert len(result["history"]) == 2 and stopping.epochs == 2
    dptrain.fit(Module(), data(), epochs=2, batch_size=16, callbacks=[CountAndStop()], progress=False, log=None,
                checkpoint_dir=str(tmp_path))
    again = CountAndStop()
    dptrain.fit(Module(), data(), epochs=3, batch_size=16, callbacks=[again], progress=False, log=None,
                checkpoint_dir=str(tmp_path), resume=True)
    assert again.epochs == 3                     # 2 from the checkpoint, then its third epoch


def test_hooks_fit_does_not_call_are_named_and_a_plain_model_is_told_to_write_a_dptrain_callback():
    class Batches(LCallback):
        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            raise AssertionError("not called")
    lines = []
    dptrain.fit(Module(), data(), data(), epochs=1, batch_size=16, callbacks=[Batches()], progress=False,
                log=lines.append)
    assert any("its on_test_batch_end not called: give that work to a dptrain.Callback" in line for line in lines)
    with pytest.raises(TypeError, match="whose hooks take that framework's trainer: write it as a dptrain.Callback"):
        # (before any set-up: the float64 data would fail the float32 model's trial step first)
        dptrain.fit(nn.Linear(4, 2), data(), epochs=1, callbacks=[Batches()], optimizer=torch.optim.SGD, lr=0.1,
                    log=None, progress=False)


ORDER = []      # (the module's hooks and the callback's, in turn: not a list the module holds, which its copies keep)


class Probs(Module):
    """validation_step returns its loss and probabilities; the module's own batch hooks mark their turn."""

    def validation_step(self, batch, batch_idx):
        logits = self.net(batch[0])
        return {"loss": F.cross_entropy(logits, batch[1]), "probs": logits.softmax(1)}

    def on_validation_batch_start(self, batch, batch_idx):
        ORDER.append(("module start", batch_idx))

    def on_validation_batch_end(self, outputs, batch, batch_idx):
        ORDER.append(("module end", batch_idx))


class EvalRecorder(LCallback):
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx):
        ORDER.append(("start", batch_idx, len(batch[0]), trainer.validating))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            logits = pl_module.net(batch[0])
        torch.testing.assert_close(outputs["probs"], logits.softmax(1), rtol=1e-12, atol=1e-12)
        ORDER.append(("end", batch_idx, float(outputs["loss"]), float(F.cross_entropy(logits, batch[1]))))


@pytest.mark.parametrize("devices", [1, 3])
def test_a_callbacks_validation_batch_hooks_get_the_whole_batch_and_its_outputs(devices):
    ORDER.clear()
    lines = []
    dptrain.fit(Probs(), data(), data(), epochs=1, batch_size=16, devices=devices, shuffle=False,
                callbacks=[EvalRecorder()], log=lines.append, progress=False)
    # the one-sample check first (the module's hooks alone), then each of the 4 batches: the callback's
    # start, every device's part's module hooks (3 devices: parts of 6, 5 and 5), the callback's end
    assert ORDER[:2] == [("module start", 0), ("module end", 0)]
    per_batch = 2 + 2 * devices
    assert len(ORDER) == 2 + 4 * per_batch
    for b in range(4):
        got = ORDER[2 + b * per_batch: 2 + (b + 1) * per_batch]
        assert got[0] == ("start", b, 16, True)
        assert sorted(got[1:-1]) == sorted([("module start", b), ("module end", b)] * devices)
        assert got[-1][:2] == ("end", b) and got[-1][2] == pytest.approx(got[-1][3], rel=1e-12)   # the batch's loss
    assert not any("on_validation_batch" in line and "not called" in line for line in lines)


def test_parts_a_callback_cannot_be_given_joined_are_an_error_naming_the_fix():
    class Named(Module):
        def validation_step(self, batch, batch_idx):
            return {"loss": F.cross_entropy(self.net(batch[0]), batch[1]), "where": str(batch[0].device) + str(len(batch[0]) + id(self))}

    class End(LCallback):
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            pass
    with pytest.raises(TypeError, match="cannot be joined"):
        dptrain.fit(Named(), data(), data(), epochs=1, batch_size=16, devices=2, callbacks=[End()], log=None,
                    progress=False)


def test_the_line_says_how_a_callbacks_outputs_are_joined():
    lines = []
    dptrain.fit(Probs(), data(), data(), epochs=1, batch_size=16, devices=2, callbacks=[EvalRecorder()],
                log=lines.append, progress=False)
    assert any("its on_validation_batch_end gets this process's batch and its devices' outputs joined (per-sample "
               "rows concatenated, a float number taken as a mean, an integer as a count)" in line for line in lines)


class WeightAveraging(LCallback):
    """Lightning's stock callbacks: hooks of Lightning's own, for its Trainer's loops (their shape)."""
    __module__ = "lightning.pytorch.callbacks.weight_averaging"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        raise AssertionError("not run")


class EMAWeightAveraging(WeightAveraging):
    pass


class ModelPruning(LCallback):
    __module__ = "lightning.pytorch.callbacks.pruning"

    def on_train_epoch_end(self, trainer, pl_module):
        raise AssertionError("not run")


class LambdaCallback(LCallback):
    """Lightning's: the hooks given are set on the instance."""
    __module__ = "lightning.pytorch.callbacks.lambda_function"

    def __init__(self, **hooks):
        for name, fn in hooks.items():
            setattr(self, name, fn)


def test_lightnings_stock_callbacks_are_refused_naming_what_does_their_work():
    """Their hooks are Lightning's code for its Trainer: called, they did nothing (found in session 62: Lightning
    2.6.6's EMAWeightAveraging, BackboneFinetuning and ModelPruning ran "with the module's trainer" and changed
    nothing); a subclass of one's own too (its hooks are still theirs)."""
    with pytest.raises(TypeError, match=r"EMAWeightAveraging is a subclass of Lightning's WeightAveraging, whose hooks "
                                        r"\(on_train_batch_end\) are Lightning's code for its Trainer's loops, which fit "
                                        r"does not run \(they would do nothing here\): give fit callbacks=\[ema := "
                                        r"dptrain.callbacks.EMA\(0.999, evaluate=True\)\]"):
        dptrain.fit(Module(), data(), epochs=1, batch_size=16, callbacks=[EMAWeightAveraging()], log=None,
                    progress=False)
    mine = type("PruneMore", (ModelPruning,), {"__module__": "mine", "amount": 0.7})
    with pytest.raises(TypeError, match=r"PruneMore is a subclass of Lightning's ModelPruning.*prune the model "
                                        r"before fit"):
        dptrain.fit(Module(), data(), epochs=1, batch_size=16, callbacks=[mine()], log=None, progress=False)


def test_a_lambda_callbacks_hooks_set_on_it_are_called():
    epochs = []
    cb = LambdaCallback(on_train_epoch_end=lambda trainer, module: epochs.append(trainer.current_epoch))
    dptrain.fit(Module(), data(), epochs=2, batch_size=16, callbacks=[cb], devices=2, log=None, progress=False)
    assert epochs == [0, 1]
