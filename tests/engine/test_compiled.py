"""--compile: the same training as eager (within float tolerance), compiled before the first
epoch (timed apart), and checkpoints that move between compiled and eager runs."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.outputs.checkpoint import load_checkpoint
from dptrain.engine.compiled import check_mode, without_prefix


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def data(n=45, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def train(compile, **kw):
    model = net()
    result = dptrain.fit(model, data(), data(20, 1), optimizer="sgd", optimizer_params={"momentum": 0.9},
                         lr=0.05, batch_size=10, epochs=kw.pop("epochs", 2), devices=2, compile=compile,
                         log=None, **kw)
    return model, result


def test_compiled_training_equals_eager_and_is_timed_apart(tmp_path):
    eager, r_eager = train(None)
    compiled, r_comp = train(True, checkpoint_dir=str(tmp_path / "c"))
    assert r_comp["compile"] == "default" and r_comp["compile_sec"] > 0 and "compile" not in r_eager
    for (name, p), q in zip(eager.state_dict().items(), compiled.state_dict().values()):
        torch.testing.assert_close(p.float(), q.float(), rtol=1e-4, atol=1e-5, msg=name)   # BN buffers too
    for a, b in zip(r_eager["history"], r_comp["history"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    # Its checkpoint holds the module's own keys: an eager run resumes it (and a compiled one would).
    saved = load_checkpoint(tmp_path / "c")["engine"]["model"]
    assert set(saved) == set(net().state_dict())
    more, r_more = train(None, epochs=3, checkpoint_dir=str(tmp_path / "c"), resume=True)
    assert [h["epoch"] for h in r_more["history"]] == [1, 2, 3]


def test_keys_of_a_compiled_module_load():
    compiled = torch.compile(net())
    state = compiled.state_dict()
    assert all(k.startswith("_orig_mod.") for k in state)
    net().load_state_dict(without_prefix(state))


def test_what_compile_does_not_take():
    assert check_mode(None) is None and check_mode(True) == "default"
    with pytest.raises(ValueError, match="unknown compile mode 'fast'"):
        check_mode("fast")
    with pytest.raises(ValueError, match="compile and sync_batchnorm=True do not go together"):
        train(True, sync_batchnorm=True)


def test_a_model_the_user_compiled_trains_as_the_plain_loop_on_two_devices():
    """``fit(torch.compile(model))`` (an Accelerate or Lightning user's habit): the module inside
    ends trained as the plain loop trains it, and predict runs the compiled one."""
    from tests.parallel.plain_loop import plain_steps
    X, y = data(40)
    X = X.flatten(1)

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3))
    model, plain = mlp(), mlp()
    compiled = torch.compile(model)
    dptrain.fit(compiled, (X, y), epochs=2, batch_size=8, shuffle=False, devices=2, log=None,
                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.3))
    plain_steps(plain, torch.optim.SGD(plain.parameters(), lr=0.3), X, y, batch_size=8, epochs=2)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dptrain.predict(compiled, X, devices=2), plain(X).detach(), rtol=1e-5, atol=1e-5)
