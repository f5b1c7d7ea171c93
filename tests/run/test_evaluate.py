"""``dptrain.evaluate``: the figures of fit's last epoch on the same data, on 1-3 devices
(uneven shards too); any loss, pair metrics and metric objects; the model left as it was."""
import pytest
import torch
from torch import nn

import dptrain


def classification(n, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).long()


def errors(output, target):
    return (output.argmax(1) != target).sum(), target.numel()


def test_the_figures_of_fits_last_epoch_on_any_devices():
    """53 evaluation samples in batches of 16 (shards of 6 and 5 on 3 devices)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    result = dptrain.fit(model, classification(150, 0), classification(53, 1), metrics={"err": errors}, epochs=3,
                         batch_size=16, devices=1, log=None, progress=False,
                         optimizer=torch.optim.AdamW, lr=0.01)
    want = {k: v for k, v in result.items() if k.startswith("test_")}
    assert set(want) == {"test_loss", "test_acc", "test_err"} and want["test_acc"] > 0.7
    model.train()
    for devices in (1, 2, 3):
        got = dptrain.evaluate(model, classification(53, 1), metrics={"err": errors}, batch_size=16, devices=devices)
        assert got == pytest.approx(want, rel=1e-6), devices
        assert got["test_acc"] + got["test_err"] == pytest.approx(1.0)
    assert model.training and all(p.grad is None for p in model.parameters())     # as it was


def test_any_loss_dict_batches_metric_objects_and_a_frozen_model():
    torchmetrics = pytest.importorskip("torchmetrics")
    g = torch.Generator().manual_seed(2)
    X = torch.randn(37, 3, generator=g)
    model = nn.Linear(3, 1).requires_grad_(False)            # nothing to train: evaluation needs no optimizer
    want = nn.functional.l1_loss(model(X), X[:, :1]).item()
    got = dptrain.evaluate(model, {"x": X, "target": X[:, :1]}, loss=nn.L1Loss(), devices=2, batch_size=10,
                           forward=lambda m, b: (m(b["x"]), b["target"]),
                           metrics={"r2": torchmetrics.R2Score()})
    assert set(got) == {"test_loss", "test_r2"} and got["test_loss"] == pytest.approx(want, rel=1e-6)
    assert got["test_r2"] == pytest.approx(float(torchmetrics.functional.r2_score(model(X), X[:, :1])), rel=1e-5)
    with pytest.raises(ValueError, match="amp must be 'bf16', 'fp16' or None, got 'half'"):
        dptrain.evaluate(model, (X, X[:, :1]), loss=nn.L1Loss(), amp="half")


def test_auto_is_one_cpu_device_without_a_gpu():
    """Prediction and evaluation on virtual devices were slower (session 18): auto keeps one."""
    from dptrain.distributed import DistEnv
    from dptrain.run.session import inference_devices
    env = DistEnv.current()
    if dptrain.num_gpus():
        assert inference_devices("auto", env) == [torch.device("cuda", i) for i in range(dptrain.num_gpus())]
        return
    assert inference_devices("auto", env) == [dptrain.cpu(0)]
    assert inference_devices(2, env) == [dptrain.cpu(0), dptrain.cpu(1)]
