"""BestCheckpoint with save_top_k: the k best epochs' weights on disk, named by epoch and
figures, the others deleted, the same files after a Ctrl-C and resume; its checks."""
import signal

import pytest
import torch

import dptrain
from dptrain.callbacks import BestCheckpoint
from dptrain.core.errors import Interrupted
from tests.callbacks.test_training import Snapshots, train


def test_the_k_best_epochs_are_kept_and_the_others_deleted(tmp_path):
    best, snaps = BestCheckpoint(str(tmp_path / "best-{epoch}.pt"), monitor="test_loss", save_top_k=3), Snapshots()
    _, result = train(2, [best, snaps], epochs=8, lr=0.3)
    losses = {r["epoch"]: r["test_loss"] for r in result["history"]}
    top = sorted(losses, key=losses.get)[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"best-{e}.pt" for e in top)
    assert [k[1] for k in best.kept] == top and best.best_path == str(tmp_path / f"best-{top[0]}.pt")
    for epoch in top:
        saved = torch.load(tmp_path / f"best-{epoch}.pt", weights_only=True)
        assert saved["epoch"] == epoch and saved["value"] == losses[epoch]
        for k, v in snaps.epochs[epoch].items():
            assert torch.equal(saved["model"][k], v), k
    assert best.best_epoch == top[0]


def test_files_named_by_figures_and_one_best_file_replaced(tmp_path):
    best = BestCheckpoint(str(tmp_path / "e{epoch:02d}-{test_loss:.4f}.pt"))
    _, result = train(1, [best], epochs=6, lr=0.3)
    losses = {r["epoch"]: r["test_loss"] for r in result["history"]}
    epoch = min(losses, key=losses.get)
    assert [p.name for p in tmp_path.iterdir()] == [f"e{epoch:02d}-{losses[epoch]:.4f}.pt"]   # the older bests deleted


def test_the_kept_files_survive_a_ctrl_c_resume(tmp_path):
    class CtrlC(dptrain.Callback):
        def on_epoch_end(self, run, epoch, row):
            if epoch == 4:
                signal.raise_signal(signal.SIGINT)
    whole = BestCheckpoint(str(tmp_path / "whole" / "b{epoch}.pt"), save_top_k=2)
    train(1, [whole], epochs=8, lr=0.3)
    part = str(tmp_path / "part" / "b{epoch}.pt")
    with pytest.raises(Interrupted):
        train(1, [BestCheckpoint(part, save_top_k=2), CtrlC()], epochs=8, lr=0.3,
              checkpoint_dir=str(tmp_path / "run"))
    resumed = BestCheckpoint(part, save_top_k=2)
    train(1, [resumed, CtrlC()], epochs=8, lr=0.3, checkpoint_dir=str(tmp_path / "run"), resume=True)
    assert [k[:2] for k in resumed.kept] == [k[:2] for k in whole.kept]
    assert sorted(p.name for p in (tmp_path / "part").iterdir()) == sorted(p.name for p in (tmp_path / "whole").iterdir())


def test_bad_settings_are_errors_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"save_top_k=3 keeps 3 files: put \{epoch\} \(or \{step\}\) in the path, e.g. "
                                         r"BestCheckpoint\('.*best-\{epoch\}.pt', save_top_k=3\)"):
        BestCheckpoint(str(tmp_path / "best.pt"), save_top_k=3)
    with pytest.raises(ValueError, match=r"save_top_k must be a whole number >= 1 \(or -1: every evaluation's\), "
                                         r"got 0"):
        BestCheckpoint(str(tmp_path / "b{epoch}.pt"), save_top_k=0)
    with pytest.raises(ValueError, match=r"save_top_k=-1 keeps a file for every evaluation: put \{epoch\}"):
        BestCheckpoint(str(tmp_path / "best.pt"), save_top_k=-1)
    with pytest.raises(ValueError, match=r"the path names 'test_f1' , which the epoch's row does not give"):
        train(1, [BestCheckpoint(str(tmp_path / "b{test_f1}.pt"))], epochs=1)
    (tmp_path / "old-7.pt").write_bytes(b"another run's")
    with pytest.raises(ValueError, match="old-7.pt already exists"):
        train(1, [BestCheckpoint(str(tmp_path / "old-{epoch}.pt"), save_top_k=2)], epochs=1)


def test_step_evaluations_are_heard_once_each_and_name_files_by_step(tmp_path):
    """eval_every_n_steps=3 on 6 batches an epoch: evaluations at steps 3, 6 (the epoch's end:
    heard once), 9, ...; the two best of them all are kept, by step."""
    best = BestCheckpoint(str(tmp_path / "b-{step}.pt"), monitor="test_loss", save_top_k=2)
    _, result = train(1, [best], epochs=4, lr=0.3, eval_every_n_steps=3)
    scores = {r["step"]: r["test_loss"] for r in result["step_history"] if "test_loss" in r}
    assert sorted(scores) == [3, 6, 9, 12, 15, 18, 21, 24]
    top = sorted(scores, key=lambda s: (scores[s], s))[:2]
    assert [k[2] if k[2] is not None else k[1] * 6 for k in best.kept] == top
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"b-{s}.pt" for s in top)
    for s in top:
        assert torch.load(tmp_path / f"b-{s}.pt", weights_only=True)["step"] == s
    with pytest.raises(ValueError, match=r"hears the evaluations every eval_every_n_steps: name its files by the "
                                         r"step too, e.g. '.*b-\{step\}-\{epoch\}.pt'"):
        train(1, [BestCheckpoint(str(tmp_path / "x" / "b-{epoch}.pt"), save_top_k=2)], epochs=1,
              eval_every_n_steps=3)


def test_save_top_k_minus_one_keeps_every_evaluations_file(tmp_path):
    """Lightning's save_top_k=-1: each epoch's weights, none deleted, the best first in kept."""
    every = BestCheckpoint(str(tmp_path / "e{epoch}.pt"), save_top_k=-1)
    _, result = train(1, [every], epochs=5, lr=0.3)
    losses = [r["test_loss"] for r in result["history"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"e{n}.pt" for n in range(1, 6)]
    assert every.best_path == str(tmp_path / f"e{losses.index(min(losses)) + 1}.pt") and len(every.kept) == 5
