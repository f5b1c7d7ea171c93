"""Keras's, Lightning's and Hugging Face's stock callbacks given to ``fit`` as their programs give them: their
``EarlyStopping`` runs as dptrain's with the same settings; the others are an error naming,
settings written in, what does their work here (a line that runs as it is).

The peers are not installed in CI: the stand-ins carry the classes' module names and the
attributes their ``__init__`` keeps (Lightning 2.6: ``min_delta`` signed by the mode; Keras 3)."""
import re

import pytest
import torch
from torch import nn

import dptrain
from dptrain.callbacks import EarlyStopping

g = torch.Generator().manual_seed(0)
X = torch.randn(64, 4, generator=g)
Y = (X[:, 0] > 0).long()
NOISY = torch.randint(0, 2, (64,), generator=g)     # evaluation labels the model cannot learn: it stops early


def peer(module, name, **attributes):
    cls = type(name, (), {"__module__": module, "on_train_end": lambda self, logs=None: None})     # (Keras's)
    cb = cls()
    cb.__dict__.update(attributes)
    return cb


def lightning_early_stopping(monitor, patience=3, min_delta=0.0, mode="min"):
    return peer("lightning.pytorch.callbacks.early_stopping", "EarlyStopping", monitor=monitor, patience=patience,
                min_delta=min_delta * (1 if mode == "max" else -1), mode=mode, verbose=False, check_finite=True,
                stopping_threshold=None, divergence_threshold=None)


def keras_early_stopping(monitor="val_loss", patience=0, min_delta=0, mode="auto", restore_best_weights=False):
    return peer("keras.src.callbacks.early_stopping", "EarlyStopping", monitor=monitor, patience=patience,
                min_delta=abs(min_delta), mode=mode, verbose=0, baseline=None,
                restore_best_weights=restore_best_weights, start_from_epoch=0)


def run(callbacks, lines=None):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    result = dptrain.fit(model, (X, Y), (X, NOISY), callbacks=callbacks, optimizer=torch.optim.SGD, lr=0.5,
                         epochs=12, batch_size=16, devices=2, progress=False,
                         log=lines.append if lines is not None else None)
    return model, result


@pytest.mark.parametrize("theirs, ours, said", [
    (lightning_early_stopping("val_loss", patience=2, min_delta=0.01),
     EarlyStopping("val_loss", patience=2, min_delta=0.01, mode="min"),
     "lightning's EarlyStopping runs as dptrain.callbacks.EarlyStopping(monitor='val_loss', patience=2, "
     "min_delta=0.01, mode='min')"),
    (keras_early_stopping(restore_best_weights=True),          # Keras's patience=0: the first epoch with no best
     EarlyStopping("val_loss", patience=1, restore_best_weights=True),
     "keras's EarlyStopping runs as dptrain.callbacks.EarlyStopping(monitor='val_loss', patience=1, "
     "restore_best_weights=True)"),
    (keras_early_stopping("val_accuracy", patience=2, mode="max"), EarlyStopping("val_accuracy", 2, mode="max"),
     "keras's EarlyStopping runs as dptrain.callbacks.EarlyStopping(monitor='val_accuracy', patience=2, "
     "mode='max')"),
])
def test_a_peers_early_stopping_stops_as_ours_with_its_settings(theirs, ours, said):
    lines = []
    model, result = run([theirs], lines)
    expected_model, expected = run([ours])
    assert len(result["history"]) == len(expected["history"]) < 12
    assert torch.equal(model.weight, expected_model.weight)
    assert f"dptrain: {said}" in lines
    run(theirs)                                 # one callback, not in a list (Lightning's Trainer takes one)


@pytest.mark.parametrize("theirs, line", [
    (peer("lightning.pytorch.callbacks.model_checkpoint", "ModelCheckpoint", dirpath="DIR", filename=None,
          monitor="val_acc", mode="max", save_top_k=2),
     "callbacks=[dptrain.callbacks.BestCheckpoint('DIR/best-{epoch}.pt', monitor='val_acc', mode='max', "
     "save_top_k=2)]"),
    (peer("keras.src.callbacks.model_checkpoint", "ModelCheckpoint", filepath="DIR/w.{epoch:02d}.weights.h5",
          monitor="val_loss", mode="auto", save_best_only=True),
     "callbacks=[dptrain.callbacks.BestCheckpoint('DIR/w.{epoch:02d}.pt', monitor='val_loss', mode='auto')]"),
    (peer("lightning.pytorch.callbacks.model_checkpoint", "ModelCheckpoint", dirpath="DIR", filename=None,
          monitor=None, mode="min", save_top_k=1), "checkpoint_dir='DIR'"),
    (peer("keras.src.callbacks.csv_logger", "CSVLogger", filename="DIR/log.csv"), "metrics_file='DIR/log.csv'"),
    (peer("transformers.trainer_callback", "EarlyStoppingCallback", early_stopping_patience=2,
          early_stopping_threshold=0.0),
     "callbacks=[dptrain.callbacks.EarlyStopping('eval_loss', patience=2, restore_best_weights=True)] (the monitor: "
     "your metric_for_best_model, 'eval_' and its name)"),
    (peer("keras.src.callbacks.reduce_lr_on_plateau", "ReduceLROnPlateau", monitor="val_loss", factor=0.5,
          patience=1),
     "scheduler=lambda optimizer: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=1), "
     "scheduler_monitor='val_loss'"),
])
def test_the_others_name_what_does_their_work_in_a_line_that_runs(theirs, line, tmp_path):
    with pytest.raises(TypeError, match="whose hooks take that framework's trainer; here give fit " + re.escape(line)):
        run([theirs])
    keyword, value = line.split("=", 1)
    value = value.split(" (")[0].split(", scheduler_monitor")[0].replace("DIR", str(tmp_path))
    torch.manual_seed(0)
    settings = {keyword: eval(value, {"dptrain": dptrain, "torch": torch})}
    if keyword == "scheduler":
        settings["scheduler_monitor"] = "val_loss"
    result = dptrain.fit(nn.Linear(4, 2), (X, Y), (X, NOISY), epochs=2, batch_size=16, devices=1, log=None,
                         progress=False, **settings)
    assert len(result["history"]) == 2


def test_what_only_shows_what_a_run_shows_is_taken_as_nothing_and_an_unknown_peer_callback_names_ours():
    shown = [peer("lightning.pytorch.callbacks.lr_monitor", "LearningRateMonitor"),
             peer("lightning.pytorch.callbacks.progress.rich_progress", "RichProgressBar"),
             peer("lightning.pytorch.callbacks.model_summary", "ModelSummary"),
             peer("keras.src.callbacks.progbar_logger", "ProgbarLogger"),
             peer("lightning.pytorch.callbacks.throughput_monitor", "ThroughputMonitor"),
             peer("lightning.pytorch.callbacks.device_stats_monitor", "DeviceStatsMonitor")]
    lines = []
    model, result = run(shown, lines)
    plain_model, plain = run([])
    assert result["history"] == [{**row, "sec": got["sec"]} for row, got in zip(plain["history"], result["history"])]
    assert "lightning's LearningRateMonitor is not needed: every row has the lr" in "\n".join(lines)
    assert "lightning's RichProgressBar is not needed: fit's progress bar (progress=True, the default)" in "\n".join(lines)
    assert "lightning's ModelSummary is not needed: print(model) shows the model" in "\n".join(lines)
    assert "keras's ProgbarLogger is not needed" in "\n".join(lines)
    assert "lightning's DeviceStatsMonitor is not run: fit logs no device statistics" in "\n".join(lines)
    mine = type("MyMonitor", (type(shown[0]),), {"__module__": "my_callbacks"})()   # (its own hooks: not dropped)
    with pytest.raises(TypeError, match=r"MyMonitor is a lightning.pytorch.callbacks.lr_monitor.LearningRateMonitor"):
        run([mine])
    with pytest.raises(TypeError, match=r"StochasticWeightAveraging.*write it as a dptrain.Callback"):
        run([peer("lightning.pytorch.callbacks.stochastic_weight_avg", "StochasticWeightAveraging")])


def test_a_subclass_of_a_peers_early_stopping_is_not_taken_for_it():
    """Its own hooks would be dropped: it is refused as any callback of that framework."""
    theirs = lightning_early_stopping("val_loss")
    mine = type("MyStopping", (type(theirs),), {"__module__": "my_callbacks"})()
    mine.__dict__.update(theirs.__dict__)
    with pytest.raises(TypeError, match=r"MyStopping is a lightning.pytorch.callbacks.early_stopping.EarlyStopping"
                                        r".*write it as a dptrain.Callback"):
        run([mine])


def test_a_subclass_of_lightnings_lr_finder_names_the_range_test_with_its_settings():
    """(Lightning's own runs the test first: tests/run/test_found_rate.py; a subclass of one's own, as
    Lightning's FineTuneLearningRateFinder example, tests at chosen epochs, which fit does not.)"""
    theirs = type(peer("lightning.pytorch.callbacks.lr_finder", "LearningRateFinder"))
    finder = type("FineTuneLearningRateFinder", (theirs,), {"__module__": "mine"})()
    finder.__dict__.update(_min_lr=1e-6, _max_lr=0.5, _num_training_steps=50)
    with pytest.raises(TypeError, match=re.escape("here give fit lr=dptrain.lr_find(model, data, min_lr=1e-06, "
                                                  "max_lr=0.5, num_training=50, loss=..., optimizer=...).suggestion()")):
        run([finder])
    lr = dptrain.lr_find(nn.Linear(4, 2), (X, Y), min_lr=1e-6, max_lr=0.5, num_training=50, batch_size=16,
                         devices=1).suggestion()
    assert 1e-6 <= lr <= 0.5
