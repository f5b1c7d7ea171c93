"""A keyword of Keras's or Lightning's, or a typo, given to evaluate or predict: the error
names dptrain's (as fit's do); Keras's evaluate(x, y) says the data is one argument."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.run.keywords import keywords_checked, unexpected_keyword


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, generator=g), torch.randint(0, 2, (8,), generator=g)


@pytest.mark.parametrize("call, said", [
    (lambda m, X, y: dptrain.evaluate(m, (X, y), verbose=0), r"'verbose'; dptrain has none: evaluate prints nothing"),
    (lambda m, X, y: dptrain.evaluate(m, (X, y), batchsize=4), r"'batchsize'; did you mean 'batch_size'\?"),
    (lambda m, X, y: dptrain.evaluate(m, X, y), r"evaluate\(\) takes the data as one argument, evaluate\(model, "
                                                r"\(X, y\)\) \(Keras's evaluate\(x, y\)\)"),
    (lambda m, X, y: dptrain.predict(m, X, verbose=0), r"'verbose'; dptrain has none: predict prints nothing"),
    (lambda m, X, y: dptrain.predict(m, dataloaders=X), r"'dataloaders'; dptrain's is data \(the second argument"),
    (lambda m, X, y: dptrain.predict(m, X, ckpt_path="best.pt"), r"dptrain.load_weights\(model, path\) first"),
    (lambda m, X, y: dptrain.fit(m, (X, y), verbose=0), r"'verbose'; dptrain's is log \(log=None: quiet"),
    (lambda m, X, y: dptrain.fit(m, (X, y), epoch=1), r"'epoch'; did you mean 'epochs'\?")])
def test_a_peers_keyword_or_a_typo_names_ours_before_anything_runs(call, said):
    model = nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TypeError, match=said):
        call(model, *data())
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_the_checked_functions_keep_their_name_signature_and_work():
    model = nn.Linear(3, 2)
    X, y = data()
    assert dptrain.evaluate.__name__ == "evaluate" and "batch_size" in str(__import__("inspect").signature(
        dptrain.evaluate))
    assert dptrain.evaluate(model, (X, y), devices=1, batch_size=4)["test_acc"] >= 0
    assert dptrain.predict(model, X, devices=1).shape == (8, 2)

    @keywords_checked({"old": "new"})
    def f(a, *, new=1, other=2):
        return a + new + other
    assert f(1, new=2) == 5
    with pytest.raises(TypeError, match="'old'; dptrain's is new"):
        f(1, old=2)
    with pytest.raises(TypeError, match="'zzz'; it takes new, other"):
        f(1, zzz=2)
    assert "did you mean 'other'" in str(unexpected_keyword("f", "otter", ["new", "other"], {}))
