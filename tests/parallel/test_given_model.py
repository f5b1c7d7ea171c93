"""The model as a user hands it over: a DDP or DataParallel wrapper trains as the module inside;
models dptrain runs but cannot train are refused with the fix."""
import pytest
import torch
from torch import nn

import dptrain


def test_a_model_wrapped_for_ddp_or_data_parallel_trains_as_the_module_it_wraps(tmp_path):
    """A DDP script's model handed over wrapped: dptrain trains the module inside (the wrapper
    would sum the gradients a second time, or cannot be copied), and ``predict`` runs it."""
    import torch.distributed as dist
    from dptrain.parallel.given_model import unwrapped
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g)
    trained = []
    for wrap in (lambda m: m, nn.DataParallel):
        torch.manual_seed(0)
        inner = nn.Linear(4, 2)
        model = wrap(inner)
        result = dptrain.fit(model, (X, y), epochs=1, batch_size=8, shuffle=False, devices=2, optimizer="sgd", lr=0.1,
                             log=None)
        trained.append((inner.weight.detach().clone(), result["history"][-1]["train_loss"]))
        assert torch.equal(dptrain.predict(model, X, devices=2), inner(X).detach())
    assert torch.equal(trained[0][0], trained[1][0]) and trained[0][1] == trained[1][1]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        inner = nn.Linear(4, 2)
        assert unwrapped(nn.parallel.DistributedDataParallel(inner)) is inner
    finally:
        dist.destroy_process_group()


def test_a_torchscript_model_is_refused_for_training_and_predicted_with():
    """A scripted model cannot be copied or watched for edits: training it is an error naming the
    fix (one device failed inside dptrain, several trained a non-leaf copy); predict and evaluate
    run it on every device."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    scripted = torch.jit.script(net)
    X, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    for devices in (1, 2):
        with pytest.raises(TypeError, match="TorchScript.*script it afterwards"):
            dptrain.fit(scripted, (X, y), epochs=1, batch_size=8, devices=devices, log=None)
        assert torch.allclose(dptrain.predict(scripted, X, devices=devices, batch_size=8), net(X), atol=1e-6)
    assert dptrain.evaluate(scripted, (X, y), devices=2, batch_size=8)["test_loss"] == pytest.approx(
        nn.functional.cross_entropy(net(X), y).item(), rel=1e-5)
