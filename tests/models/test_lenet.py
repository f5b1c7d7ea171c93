import pytest
import torch
import torch.nn.functional as F

from dptrain.models import GluonLeNet, ScratchLeNet, lenet, lenet_params, lenet_reference


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_fast_lenet_equals_the_layer_by_layer_spec(batch):
    """Cropping unused pixels and channels_last change nothing: same outputs, same gradients."""
    X = torch.rand(batch, 1, 28, 28, generator=torch.Generator().manual_seed(batch))
    y = torch.arange(batch) % 10
    p_fast = [p.requires_grad_() for p in lenet_params(scale=0.1, generator=torch.Generator().manual_seed(0))]
    p_ref = [p.detach().clone().requires_grad_() for p in p_fast]
    out_fast, out_ref = lenet(X, p_fast), lenet_reference(X, p_ref)
    torch.testing.assert_close(out_fast, out_ref)
    g_fast = torch.autograd.grad(F.cross_entropy(out_fast, y), p_fast)
    g_ref = torch.autograd.grad(F.cross_entropy(out_ref, y), p_ref)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b)


def test_scratch_params_follow_the_reference():
    params = lenet_params(generator=torch.Generator().manual_seed(0))
    assert [tuple(p.shape) for p in params] == [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,),
                                                (800, 128), (128,), (128, 10), (10,)]
    assert all((p == 0).all() for p in params[1::2])
    assert 0.008 < params[4].std().item() < 0.012


def test_module_versions_give_ten_logits():
    X = torch.rand(3, 1, 28, 28)
    assert ScratchLeNet()(X).shape == (3, 10)
    assert GluonLeNet()(X).shape == (3, 10)
    assert sum(p.numel() for p in GluonLeNet().parameters()) == 6 * 25 + 6 + 16 * 54 + 16 + 400 * 120 + 120 + 120 * 84 + 84 + 850


def test_gluon_lenet_pooling_before_relu_changes_nothing():
    """relu(maxpool(x)) == maxpool(relu(x)), gradients included: the reordering is exact."""
    torch.manual_seed(0)
    fast = GluonLeNet()
    plain = torch.nn.Sequential(fast[0], torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2),
                                fast[3], torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2), *list(fast)[6:])
    X, y = torch.rand(16, 1, 28, 28), torch.arange(16) % 10
    a = torch.autograd.grad(F.cross_entropy(fast(X), y), list(fast.parameters()))
    b = torch.autograd.grad(F.cross_entropy(plain(X), y), list(fast.parameters()))
    torch.testing.assert_close(fast(X), plain(X), rtol=0, atol=0)
    for g, h in zip(a, b):
        torch.testing.assert_close(g, h, rtol=0, atol=0)
