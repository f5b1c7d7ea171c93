"""``metrics_file="m.csv"``: the epoch records as a table (Keras's and Lightning's CSVLogger),
read back equal to the JSON lines of the same run; never mixed with another run's."""
import csv

import pytest
import torch
from torch import nn

import dptrain
from dptrain.outputs.metrics_file import csv_records, csv_text, read_metrics


class Norm(dptrain.Callback):
    """A figure of the user's, from epoch 2 on (its column comes then)."""
    def on_epoch_end(self, run, epoch, row):
        if epoch >= 2:
            row["weight_norm"] = float(run.model.weight.detach().norm())


def run(path, epochs=3, **kw):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 5, generator=g)
    data = (X, (X[:, 0] > 0).long())
    torch.manual_seed(0)
    return dptrain.fit(nn.Linear(5, 2), data, data, epochs=epochs, batch_size=16, devices=2, eval_every=2,
                       metrics_file=str(path), callbacks=[Norm()], log=None, progress=False, **kw)


def test_a_csv_file_holds_the_same_records_as_the_json_lines(tmp_path):
    run(tmp_path / "m.jsonl")
    result = run(tmp_path / "m.csv")
    table, lines = read_metrics(tmp_path / "m.csv"), read_metrics(tmp_path / "m.jsonl")
    strip = [{k: v for k, v in r.items() if k not in ("sec", "images_per_sec")} for r in table]
    assert strip == [{k: v for k, v in r.items() if k not in ("sec", "images_per_sec")} for r in lines]
    assert [r["weight_norm"] for r in table[1:]] == [r["weight_norm"] for r in result["history"][1:]]
    assert "test_acc" not in table[0] and table[1]["test_acc"] == result["history"][1]["test_acc"]
    with open(tmp_path / "m.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header[:3] == ["epoch", "sec", "train_loss"] and {"test_acc", "weight_norm", "devices"} <= set(header)
    assert table[0]["devices"] == ["cpu:0", "cpu:1"]                # (a list: a JSON cell)
    with pytest.raises(ValueError, match="already holds 3 record.s. of another run: pass resume=True"):
        run(tmp_path / "m.csv")


def test_a_resumed_run_writes_the_checkpoints_epochs_then_the_new_ones(tmp_path):
    path, ckpt = tmp_path / "m.csv", tmp_path / "ckpt"
    run(path, epochs=2, checkpoint_dir=str(ckpt))
    whole = run(tmp_path / "whole.csv", epochs=4)
    run(path, epochs=4, checkpoint_dir=str(ckpt), resume=True)
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2, 3, 4]
    assert [r.get("test_loss") for r in read_metrics(path)] == [r.get("test_loss") for r in whole["history"]]


def test_cells_read_back_as_they_were_written():
    records = [{"epoch": 1, "train_loss": 0.1 + 0.2, "note": 'a, "quoted" text', "split": [3, 5]},
               {"epoch": 2, "train_loss": float("inf"), "flag": True, "none": None}]
    assert csv_records(csv_text(records)) == [records[0], {"epoch": 2, "train_loss": float("inf"), "flag": True}]
    texts = {"id": "12", "rate": "1e-3", "word": "nan", "list": "[1]", "yes": "true", "quoted": '"x"', "empty": ""}
    assert csv_records(csv_text([texts])) == [texts]        # strings that look like other things stay strings
