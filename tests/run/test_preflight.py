"""Outputs are checked before the first batch: regular files only, one path each, nothing of
the user's replaced without --overwrite."""
import os

import pytest

from dptrain.run.config import TrainConfig
from dptrain.run.preflight import check_outputs


def test_a_device_a_fifo_and_a_folder_are_not_outputs(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for flag, kw, path, kind in (("--metrics", "metrics_file", "/dev/zero", "a device"),
                                 ("--trace", "trace", "/dev/full", "a device"),
                                 ("--metrics", "metrics_file", str(fifo), "a FIFO"),
                                 ("--trace", "trace", str(tmp_path), "a folder")):
        with pytest.raises(ValueError, match=f"{flag} {path} is {kind}: an output is a regular file"):
            check_outputs(TrainConfig(**{kw: path}))
    with pytest.raises(ValueError, match="--plot /dev/null is a device"):
        check_outputs(TrainConfig(), plot="/dev/null")


def test_two_outputs_on_one_path_are_refused(tmp_path):
    same = str(tmp_path / "same.json")
    with pytest.raises(ValueError, match="--metrics and --trace both write .*same.json: give each its own path"):
        check_outputs(TrainConfig(metrics_file=same, trace=same))
    with pytest.raises(ValueError, match="--metrics and --plot both write"):
        check_outputs(TrainConfig(metrics_file=str(tmp_path / "x.png")), plot=str(tmp_path / "x.png"))


def test_an_existing_trace_is_kept_unless_overwrite(tmp_path):
    keep = tmp_path / "keep.json"
    keep.write_text("mine")
    with pytest.raises(ValueError, match="--trace .*keep.json already exists: pass --overwrite"):
        check_outputs(TrainConfig(trace=str(keep)))
    check_outputs(TrainConfig(trace=str(keep), overwrite=True))
    assert keep.read_text() == "mine"        # checked, not touched
