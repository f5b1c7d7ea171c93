"""A loss by name (``loss="mse"``, as ``--loss mse`` and ``optimizer="adam"``): torch's module,
Keras's names too; Keras's probability cross-entropies and unknown names are errors naming
the choices."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.engine.loss_names import ALIASES, LOSSES, loss_named


def regression():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 3, generator=g)
    return X, X.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)


@pytest.mark.parametrize("name, module", [("mse", nn.MSELoss), ("mean_squared_error", nn.MSELoss),
                                          ("mae", nn.L1Loss), ("huber", nn.HuberLoss)])
def test_a_loss_by_name_trains_and_evaluates_as_the_module(name, module):
    X, y = regression()
    results = []
    for loss in (name, module()):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        result = dptrain.fit(model, (X, y), loss=loss, epochs=2, batch_size=16, devices=2, log=None)
        results.append((model.weight.detach().clone(), result["train_loss"],
                        dptrain.evaluate(model, (X, y), loss=loss, devices=1)["test_loss"]))
    (w1, t1, e1), (w2, t2, e2) = results
    assert torch.equal(w1, w2) and t1 == t2 and e1 == e2


def test_every_name_is_a_loss_module():
    for name in [*LOSSES, *ALIASES]:
        assert isinstance(loss_named(name), nn.Module)


@pytest.mark.parametrize("name, said", [
    ("sparse_categorical_crossentropy", r"Keras's, which takes probabilities unless from_logits=True.*"
                                        r"nn.CrossEntropyLoss\(\).*nn.NLLLoss\(\)"),
    ("binary_crossentropy", r"nn.BCEWithLogitsLoss\(\) \(or 'bce'\) for logits.*nn.BCELoss\(\) for probabilities"),
    ("msee", r"unknown loss 'msee' \(did you mean 'mse'\?\); choose one of cross-entropy, mse"),
    ("hinge", r"unknown loss 'hinge'; choose one of .*or give a loss module or function")])
def test_a_name_that_would_mislead_or_is_unknown_names_the_choices(name, said):
    X, y = regression()
    with pytest.raises(ValueError, match=said):
        dptrain.fit(nn.Linear(3, 1), (X, y), loss=name, epochs=1, batch_size=16, devices=1, log=None)
