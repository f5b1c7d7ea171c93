"""A LightningDataModule as fit's data, and a LightningModule's own loaders and data hooks."""
import copy
import os
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dptrain
from dptrain.distributed.once import FailedElsewhere
from tests.distributed.helpers import run_workers
from tests.callbacks.test_lightning_hooks import EveryFourSteps
from tests.engine.test_lightning_module import Lit, TrainLogging, data
from tests.engine.test_lightning_trainer import EpochEnds, Gathering


class DM:
    """A LightningDataModule's shape: its hooks record their calls; ``prepare_data`` writes the
    set to ``root`` (a download), which ``setup`` reads (so it fails if it runs before)."""

    def __init__(self, root, fail=False):
        self.root, self.fail, self.calls = root, fail, []

    def prepare_data(self):
        self.calls.append("prepare_data")
        time.sleep(0.3)                             # (a download: the other processes must wait)
        if self.fail:
            raise ValueError("the mirror answered 404")
        torch.save((data(), data(32, 1)), f"{self.root}.part")
        os.replace(f"{self.root}.part", self.root)

    def setup(self, stage):
        self.calls.append(("setup", stage))
        (self.train_xy, self.val_xy) = torch.load(self.root)

    def train_dataloader(self):
        self.calls.append("train_dataloader")
        return DataLoader(TensorDataset(*self.train_xy), batch_size=16)

    def val_dataloader(self):
        self.calls.append("val_dataloader")
        return DataLoader(TensorDataset(*self.val_xy), batch_size=16)

    def teardown(self, stage):
        self.calls.append(("teardown", stage))


class OwnData(Lit):
    """A LightningModule with its own loaders and data hooks."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def prepare_data(self):
        self.calls.append("prepare_data")

    def setup(self, stage):
        self.calls.append(("setup", stage))

    def train_dataloader(self):
        self.calls.append("train_dataloader")
        return DataLoader(TensorDataset(*data()), batch_size=16)

    def val_dataloader(self):
        self.calls.append("val_dataloader")
        return [DataLoader(TensorDataset(*data(32, 1)), batch_size=16)]     # (a list of one: Lightning's form)

    def teardown(self, stage):
        self.calls.append(("teardown", stage))


def _fit(model, *args, **kw):
    return dptrain.fit(model, *args, **{"epochs": 2, "shuffle": False, "devices": 2, "progress": False, **kw})


def test_a_data_module_is_prepared_set_up_and_trains_as_its_loaders_given_directly(tmp_path):
    torch.manual_seed(0)
    model = Lit()
    expected = copy.deepcopy(model)
    dm, lines = DM(str(tmp_path / "set.pt")), []
    result = _fit(model, dm, log=lines.append)
    assert dm.calls == ["prepare_data", ("setup", "fit"), "train_dataloader", "val_dataloader", ("teardown", "fit")]
    assert lines[0] == ("dptrain: the data is DM.train_dataloader() and DM.val_dataloader(), as Lightning's "
                        "Trainer takes it (prepare_data() once per machine, setup('fit') in every process)")
    direct = _fit(expected, DataLoader(TensorDataset(*data()), batch_size=16),
                  DataLoader(TensorDataset(*data(32, 1)), batch_size=16), log=None)
    for a, b in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b)
    figures = [{k: v for k, v in row.items() if k.startswith(("train_", "test_"))} for row in result["history"]]
    assert figures == [{k: v for k, v in row.items() if k.startswith(("train_", "test_"))}
                       for row in direct["history"]] and "test_loss" in figures[-1]
    with pytest.raises(TypeError, match=r"datamodule'; dptrain's is train_data \(fit\(model, dm\)"):
        dptrain.fit(Lit(), datamodule=dm, log=None)


def test_a_lightning_modules_own_loaders_and_data_hooks_are_taken_where_fit_is_given_none():
    torch.manual_seed(0)
    model = OwnData()
    expected = copy.deepcopy(model)
    lines = []
    _fit(model, log=lines.append)
    assert model.calls == ["prepare_data", ("setup", "fit"), "train_dataloader", "val_dataloader", ("teardown", "fit")]
    assert lines[0].startswith("dptrain: the data is OwnData.train_dataloader() and OwnData.val_dataloader()")
    _fit(expected, DataLoader(TensorDataset(*data()), batch_size=16),
         DataLoader(TensorDataset(*data(32, 1)), batch_size=16), log=None)
    for a, b in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(a, b)
    # Loaders given come first: the module gives only what fit was not given.
    model = OwnData()
    result = _fit(model, data(), epochs=1, batch_size=32, log=None)
    assert "train_dataloader" not in model.calls and "val_dataloader" in model.calls and "test_loss" in result
    # A run that fails is torn down all the same.
    class Fails(OwnData):
        def training_step(self, batch, batch_idx):
            return None
    model = Fails()
    with pytest.raises(ValueError, match="training_step returned None"):
        _fit(model, log=None)
    assert model.calls[-1] == ("teardown", "fit")


def test_what_cannot_be_taken_is_an_error_naming_the_fix():
    with pytest.raises(TypeError, match=r"fit\(\) needs train_data: fit\(model, \(X, y\)\), a Dataset, a "
                                        r"DataLoader, or a LightningDataModule; with none, a LightningModule's own "
                                        r"train_dataloader\(\) \(none is defined here\)"):
        dptrain.fit(nn.Linear(2, 2), log=None)

    class TwoSets(OwnData):
        def val_dataloader(self):
            return [DataLoader(TensorDataset(*data(32, 1))), DataLoader(TensorDataset(*data(32, 2)))]
    with pytest.raises(ValueError, match=r"TwoSets.val_dataloader\(\) returned 2 loaders, .* give fit "
                                         r"eval_data=\{'val': loader, 'ood': other\}"):
        _fit(TwoSets(), log=None)
    with pytest.raises(TypeError, match=r"the data is a DM \(a LightningDataModule\), which fit takes as its "
                                        r"training data \(fit\(model, dm\)\), and evaluate and predict as theirs: "
                                        r"as an evaluation set, give one of its loaders"):
        _fit(Lit(), data(), DM("unused"), log=None)
    with pytest.raises(TypeError, match=r"the DM \(a LightningDataModule\) has no predict_dataloader of its own"):
        dptrain.predict(Lit(), DM("unused"), devices=1)


class Staged(DM):
    """A data module with a test and a predict loader (trainer.test's and trainer.predict's)."""

    def test_dataloader(self):
        self.calls.append("test_dataloader")
        return DataLoader(TensorDataset(*self.val_xy), batch_size=8)

    def predict_dataloader(self):
        self.calls.append("predict_dataloader")
        return DataLoader(TensorDataset(self.val_xy[0]), batch_size=8)


def test_evaluate_and_predict_take_a_data_modules_test_and_predict_loaders(tmp_path):
    torch.manual_seed(0)
    model, dm = Lit(), Staged(str(tmp_path / "set.pt"))
    figures = dptrain.evaluate(model, dm, devices=2)
    assert dm.calls == ["prepare_data", ("setup", "test"), "test_dataloader", ("teardown", "test")]
    assert figures == dptrain.evaluate(model, data(32, 1), devices=2)
    dm.calls.clear()
    out = dptrain.predict(model, dm, devices=2)
    assert dm.calls == ["prepare_data", ("setup", "predict"), "predict_dataloader", ("teardown", "predict")]
    torch.testing.assert_close(out, dptrain.predict(model, data(32, 1)[0]))


def _prepared_once_per_machine(rank, world_size, folder):
    dm = DM(os.path.join(folder, "set.pt"))
    torch.manual_seed(0)
    model = TrainLogging()
    result = dptrain.fit(model, dm, epochs=1, shuffle=False, devices=1, progress=False, log=None)
    failing = DM(os.path.join(folder, "other.pt"), fail=True)
    try:
        dptrain.fit(Lit(), failing, epochs=1, devices=1, progress=False, log=None)
    except (ValueError, FailedElsewhere) as e:
        error = f"{type(e).__name__}: {e}"
    torch.manual_seed(0)
    gathering = Gathering()
    ends = dptrain.fit(gathering, data(), data(32, 1), epochs=1, batch_size=16, shuffle=False, devices=2,
                       progress=False, log=None)["history"]      # (2 devices a process: each process's put together)
    ends[0]["callback_metrics"] = {k: float(v) for k, v in gathering.ran_by.callback_metrics.items()}
    ends[0]["step_rows"] = dptrain.fit(EveryFourSteps(), data(), data(40, 1), epochs=1, batch_size=16, devices=1,
                                       progress=False, log=None, eval_every_n_steps=4)["step_history"]
    return dm.calls, failing.calls, error, result["history"], [p.detach().tolist() for p in model.parameters()], ends


@pytest.mark.slow
def test_prepare_data_runs_in_one_process_of_the_machine_while_the_other_waits_and_its_error_ends_both(tmp_path):
    (calls0, failing0, error0, rows0, weights0, ends0), (calls1, failing1, error1, rows1, weights1, ends1) = \
        run_workers(_prepared_once_per_machine, str(tmp_path))
    # Rank 1 read the set rank 0 wrote (its setup would fail on a missing file), and both trained alike.
    assert calls0[:2] == ["prepare_data", ("setup", "fit")] and calls1[0] == ("setup", "fit")
    assert "prepare_data" not in calls1 and weights0 == weights1
    # ... as one device: what training_step logs, a metric object too, over the whole epoch.
    torch.manual_seed(0)
    one = dptrain.fit(TrainLogging(), DM(str(tmp_path / "set.pt")), epochs=1, shuffle=False, devices=1,
                      progress=False, log=None)["history"]
    for row in (rows0, rows1):
        assert {k: row[0][k] for k in ("train_loss", "train_acc", "train_f1", "test_loss")} == pytest.approx(
            {k: one[0][k] for k in ("train_loss", "train_acc", "train_f1", "test_loss")}, rel=1e-5)
    assert failing0 == ["prepare_data"] and failing1 == []
    # The epoch-end hooks, each process over its part (its 2 devices'): what they log is the mean of the processes'.
    torch.manual_seed(0)
    alone = dptrain.fit(EpochEnds(), data(), data(32, 1), epochs=1, batch_size=16, shuffle=False, devices=1,
                        progress=False, log=None)["history"]
    for ends in (ends0, ends1):      # (test_rate over the processes' parts gathered by self.all_gather)
        assert {k: ends[0][k] for k in ("test_rate", "train_step_loss")} == pytest.approx(
            {k: alone[0][k] for k in ("test_rate", "train_step_loss")}, rel=1e-5)
        assert (ends[0]["test_seen"], ends[0]["test_said"]) == (32, 7)    # (the strategy's sum; rank 0's value)
        step_row, = ends[0]["step_rows"]        # (an evaluation every 4 steps: its hook's rate, the processes' mean)
        assert step_row["test_rate"] == pytest.approx(step_row["test_acc"], rel=1e-6) and step_row["step"] == 4
        assert ends[0]["callback_metrics"] == pytest.approx(     # (as the row: what the hook logged, the mean)
            {"val_rate": ends[0]["test_rate"], "val_seen": 32, "val_said": 7,
             "train_step_loss": ends[0]["train_step_loss"]})
    assert error0 == "ValueError: the mirror answered 404"
    assert error1 == ("FailedElsewhere: DM.prepare_data() failed in the process of rank 0, which this one waited "
                      "for: ValueError: the mirror answered 404")
