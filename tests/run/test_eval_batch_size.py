"""An evaluation's batch: ``eval_batch_size``, else an evaluation DataLoader's own, else the
training's; the figures are the same whatever it is (sums over the whole set), on 1-2 devices,
in fit, evaluate and predict."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dptrain
from dptrain.cli.args import build_parser


def classification(n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    return X, (X[:, 0] - X[:, 2] > 0).long()


class Seen(nn.Module):
    """A classifier that keeps the size of every batch it evaluates (not the one-sample trial)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
        self.sizes = []

    def forward(self, x):
        if not self.training and len(x) > 1:
            self.sizes.append(len(x))
        return self.net(x)


def fitted(eval_data, devices=1, **kw):
    model = Seen()
    said = []
    result = dptrain.fit(model, classification(200, 0), eval_data, epochs=2, batch_size=20, devices=devices,
                         optimizer=torch.optim.AdamW, lr=0.01, progress=False, log=said.append, **kw)
    return model, result, said


def figures(result):
    return {k: v for k, v in result.items() if k.startswith("test_")}


def test_eval_batch_size_reads_the_evaluation_by_it_with_the_same_figures():
    by_train, r_train, _ = fitted(classification(130, 1))
    assert by_train.sizes == [20] * 6 + [10] + [20] * 6 + [10]      # two epochs, by the training's batch
    by_own, r_own, _ = fitted(classification(130, 1), eval_batch_size=50)
    assert by_own.sizes == [50, 50, 30] * 2
    assert figures(r_own) == pytest.approx(figures(r_train), rel=1e-6)
    assert r_own["history"]["test_loss"] == pytest.approx(r_train["history"]["test_loss"], rel=1e-6)
    two, r_two, _ = fitted(classification(130, 1), devices=2, eval_batch_size=50)
    assert figures(r_two) == pytest.approx(figures(r_train), rel=1e-6)


def test_an_evaluation_dataloaders_own_batch_size_is_read_and_a_given_one_wins_said():
    X, y = classification(130, 1)
    loader = DataLoader(TensorDataset(X, y), batch_size=64)
    model, result, said = fitted(loader)
    assert model.sizes == [64, 64, 2] * 2 and not any("DataLoader's batch_size" in line for line in said)
    model, again, said = fitted(loader, eval_batch_size=100)
    assert model.sizes == [100, 30] * 2
    assert "dptrain: the evaluation DataLoader's batch_size=64 is not used: eval_batch_size gives 100" in said
    assert figures(again) == pytest.approx(figures(result), rel=1e-6)


def test_several_sets_and_a_held_out_part_take_it_too():
    X, y = classification(90, 2)
    model, result, _ = fitted({"val": classification(130, 1), "ood": DataLoader(TensorDataset(X, y), batch_size=45)})
    assert sorted(set(model.sizes)) == [10, 20, 45]        # val by the training's, ood by its own loader's
    assert "test_ood_acc" in result
    model = Seen()
    dptrain.fit(model, classification(200, 0), validation_split=0.25, eval_batch_size=40, epochs=1, batch_size=20,
                devices=1, progress=False, log=None)
    assert model.sizes == [40, 10]                          # the last 50 samples held out


def test_evaluate_and_predict_read_a_dataloader_by_its_own_batch_size():
    X, y = classification(130, 1)
    model = Seen().eval()
    want = dptrain.evaluate(model, (X, y), batch_size=13, devices=1)
    model.sizes.clear()
    got = dptrain.evaluate(model, DataLoader(TensorDataset(X, y), batch_size=60), devices=1)
    assert model.sizes == [60, 60, 10] and got == pytest.approx(want, rel=1e-6)
    model.sizes.clear()
    dptrain.evaluate(model, DataLoader(TensorDataset(X, y), batch_size=60), batch_size=100, devices=1)
    assert model.sizes == [100, 30]
    model.sizes.clear()
    dptrain.evaluate(model, (X, y), devices=1)              # no loader: 256
    assert model.sizes == [130]
    model.sizes.clear()
    out = dptrain.predict(model, DataLoader(TensorDataset(X, y), batch_size=60), devices=1)
    assert model.sizes == [60, 60, 10] and torch.allclose(out, model.net(X), atol=1e-6)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="batch_size must be a whole number >= 1"):
            dptrain.evaluate(model, (X, y), batch_size=bad, devices=1)
        with pytest.raises(ValueError, match="batch_size must be a whole number >= 1"):
            dptrain.predict(model, (X, y), batch_size=bad, devices=1)


def test_the_setting_is_a_flag_and_checked_and_peers_names_point_to_it():
    assert build_parser().parse_args(["train", "--eval-batch-size", "500"]).eval_batch_size == 500
    with pytest.raises(ValueError, match="eval_batch_size must be a whole number >= 1, got 0"):
        fitted(classification(30, 1), eval_batch_size=0)
    with pytest.raises(TypeError, match="per_device_eval_batch_size.*dptrain's is eval_batch_size"):
        fitted(classification(30, 1), per_device_eval_batch_size=8)
    with pytest.raises(TypeError, match="validation_batch_size.*dptrain's is eval_batch_size"):
        fitted(classification(30, 1), validation_batch_size=8)
