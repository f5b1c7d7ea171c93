"""The notebooks in examples/ run, on a few batches, and are committed without outputs."""
from pathlib import Path

import pytest
import torch

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.ipynb"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_notebook_runs(path, data_dir, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    monkeypatch.setenv("DPTRAIN_EXAMPLE_BATCHES", "3")
    monkeypatch.setenv("DPTRAIN_DATA", data_dir)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "test acc:" in text and "sec/epoch on" in text
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())


def test_the_imbalanced_classes_example_finds_the_rare_class_with_its_sampler(capsys):
    """examples/imbalanced_classes.py: the weighted sampler, a (sum, count) recall, a plateau
    scheduler on step evaluations and the best weights restored; without the sampler the rare
    class is never predicted."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("imbalanced", Path(__file__).parents[1] / "examples" /
                                                  "imbalanced_classes.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    weighted = example.main(["--epochs", "3", "--samples", "8000", "--devices", "1"])
    shuffled = example.main(["--epochs", "3", "--samples", "8000", "--devices", "1", "--no-sampler"])
    assert weighted["test_rare_recall"] > 0.6 > shuffled["test_rare_recall"] + 0.4
    assert "restored" in capsys.readouterr().out


def test_the_stream_example_trains_on_its_shards_with_and_without_workers(tmp_path):
    """examples/train_on_a_stream.py: shard files read as a stream (set_epoch orders them, workers
    share them), steps_per_epoch batches an epoch; it learns, on 2 devices too."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("stream", Path(__file__).parents[1] / "examples" /
                                                  "train_on_a_stream.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    common = ["--shards-dir", str(tmp_path / "shards"), "--epochs", "4"]
    for more in (["--devices", "2"], ["--devices", "1", "--num-workers", "2"]):
        result = example.main(common + more)
        assert len(result["history"]) == 4 and result["test_acc"] > 0.85, (more, result["history"])
    assert len(list((tmp_path / "shards").glob("shard-*.pt"))) == 8


def test_the_gan_example_covers_the_modes_and_resumes_exactly(tmp_path):
    """examples/gan.py: two optimizers in one fit on 2 devices learn the ring's 8 modes; a run
    stopped after 2 epochs and resumed to 4 ends as the unbroken one, random latents included."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gan", Path(__file__).parents[1] / "examples" / "gan.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    last = example.main(["--epochs", "30", "--devices", "2"])["history"][-1]
    assert last["modes"] >= 6 and last["good"] > 0.3, last
    assert last["train_loss"] == pytest.approx(last["train_discriminator_loss"] + last["train_generator_loss"])
    small = ["--samples", "2048", "--devices", "2"]
    whole = example.main(small + ["--epochs", "4"])["history"][-1]
    example.main(small + ["--epochs", "2", "--checkpoint-dir", str(tmp_path)])
    again = example.main(small + ["--epochs", "4", "--checkpoint-dir", str(tmp_path), "--resume"])["history"][-1]
    assert {k: v for k, v in again.items() if k != "sec"} == {k: v for k, v in whole.items() if k != "sec"}


def test_the_lightning_gan_example_covers_the_modes_on_two_devices_and_resumes_exactly(tmp_path):
    """examples/lightning_gan.py: a LightningModule stepping its own two optimizers, on 2 devices,
    learns the ring's modes; a run stopped after 2 epochs and resumed to 4 ends as the unbroken one."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lightning_gan", Path(__file__).parents[1] / "examples" /
                                                  "lightning_gan.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    last = example.main(["--epochs", "25", "--devices", "2"])["history"][-1]
    assert last["modes"] >= 6 and last["good"] > 0.3, last
    assert {"train_d_loss", "train_g_loss", "lr_0", "lr_1"} <= set(last) and last["lr_1"] < 1e-3 == last["lr_0"]
    small = ["--samples", "2048", "--devices", "2"]
    whole = example.main(small + ["--epochs", "4"])["history"][-1]
    example.main(small + ["--epochs", "2", "--checkpoint-dir", str(tmp_path)])
    again = example.main(small + ["--epochs", "4", "--checkpoint-dir", str(tmp_path), "--resume"])["history"][-1]
    same = lambda row: {k: v for k, v in row.items() if k != "sec" and v == v}     # (train_loss: NaN, none returned)
    assert same(again) == same(whole)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon is new in torch 2.9")
def test_the_muon_example_trains_both_optimizers_on_one_loss():
    """examples/muon.py: Muon for the matrices, AdamW for the rest, on 2 devices: it learns, and
    each optimizer's scheduled rate is in the rows."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("muon", Path(__file__).parents[1] / "examples" / "muon.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--epochs", "2", "--samples", "2048", "--devices", "2"])
    first, last = result["history"]
    assert result["optimizer"] == "Muon+AdamW" and last["test_acc"] > 0.8, last
    assert last["lr_muon"] / first["lr_muon"] == pytest.approx(last["lr_adamw"] / first["lr_adamw"])
    assert last["lr_muon"] < first["lr_muon"]       # (the decay: one schedule, each rate its own scale)


def test_the_sharpness_aware_example_learns_on_two_devices_with_either_base():
    """examples/sharpness_aware.py: SAM as its users copy it, in one fit call."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sharpness_aware", Path(__file__).parents[1] / "examples" /
                                                  "sharpness_aware.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for more in (["--devices", "2"], ["--devices", "1", "--base", "adam"]):
        result = example.main(["--epochs", "3", "--samples", "2000"] + more)
        assert result["test_acc"] > 0.9, (more, result["history"])
