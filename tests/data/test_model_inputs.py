"""How a batch meets the model by default: pairs, tuples, dicts and batch objects of one's
own, and the target each holds."""
import pytest
import torch

from dptrain.data.model_inputs import input_and_target, target_of


def test_the_default_forward_reads_pairs_tuples_and_dicts():
    x, m, y = torch.zeros(2, 3), torch.ones(2, 3), torch.arange(2)
    assert input_and_target((x, y))[1] is y
    (args, kwargs), target = input_and_target((x, m, y))
    assert args == (x, m) and kwargs == {} and target is y
    (args, kwargs), target = input_and_target({"image": x, "mask": m, "label": y})
    assert args == () and set(kwargs) == {"image", "mask"} and target is y
    with pytest.raises(ValueError, match="exactly one target key"):
        input_and_target({"image": x, "label": y, "y": y})
    with pytest.raises(ValueError, match="has no target"):
        input_and_target(x)


def test_a_batch_object_meets_the_model_whole_against_its_y():
    class Graphs:
        def __init__(self, y):
            self.y = y

        def to(self, device):
            return self
    batch = Graphs(torch.arange(3))
    assert input_and_target(batch) == (((batch,), {}), batch.y) and target_of(batch) is batch.y
    with pytest.raises(ValueError, match=r"a batch of one Graphs \(an object of your own\) has no target y: pass "
                                         r"forward=lambda model, batch: \(model\(batch\), batch.<its target>\)"):
        input_and_target(Graphs(None))
    assert target_of(Graphs(None)) is None


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(4, 3), torch.nn.Linear(2, 3)

    def forward(self, image, extra):
        return self.a(image) + self.b(extra)


class _WholeDict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = None

    def forward(self, inputs):          # research code's forward of a dict, under another name
        self.seen = inputs
        return inputs["image"].sum(1, keepdim=True)


def test_a_dict_input_goes_in_by_name_where_forward_names_its_keys_else_whole():
    from dptrain.data.model_inputs import call_inputs
    x, e = torch.randn(5, 4), torch.randn(5, 2)
    two = _TwoInputs()
    assert torch.equal(call_inputs(two, ({"image": x, "extra": e},)), two(x, e))
    whole = _WholeDict()
    inputs = {"image": x, "extra": e}
    call_inputs(whole, (inputs,))
    assert whole.seen is inputs
    with pytest.raises(TypeError, match="extra"):      # a key forward does not name: the dict whole, Python's error
        call_inputs(two, ({"image": x, "other": e},))


def test_kerass_dict_of_inputs_trains_as_the_plain_loop_on_one_and_two_devices():
    """``fit(model, ({"image": X, "extra": E}, y))``, Keras's ``fit({"image": X, "extra": E}, y)``:
    it failed on "forward() missing 1 required positional argument"."""
    import copy

    import dptrain
    torch.manual_seed(1)
    X, E, y = torch.randn(64, 4), torch.randn(64, 2), torch.randint(0, 3, (64,))
    base = _TwoInputs()
    plain = copy.deepcopy(base)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for i in range(0, 64, 16):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(plain(X[i:i + 16], E[i:i + 16]), y[i:i + 16]).backward()
        opt.step()
    for devices in (1, 2):
        model = copy.deepcopy(base)
        dptrain.fit(model, ({"image": X, "extra": E}, y), epochs=1, batch_size=16, lr=0.1, devices=devices,
                    log=None, shuffle=False)
        assert max((p - q).abs().max().item() for p, q in zip(model.parameters(), plain.parameters())) < 1e-6
    out = dptrain.predict(model, ({"image": X, "extra": E}, y), devices=2)
    assert torch.allclose(out, model(X, E), atol=1e-6)


def test_kerass_sample_weights_as_a_third_item_name_sample_weight_and_the_recipe_trains_as_the_weighted_plain_loop():
    """``(X, y, w)`` is ``model(X, y)`` against ``w`` by default: the error names
    ``sample_weight=True`` (it was Python's "forward() takes 2 positional arguments but 3 were
    given"), and a loss of one's own reading the weights from the batch (the README's recipe for a
    weighted mean over the weights) trains as the plain loop's on 1 and 2 devices."""
    import copy

    import dptrain
    from torch.nn import functional as F
    torch.manual_seed(2)
    X, y, w = torch.randn(64, 4), torch.randint(0, 3, (64,)), torch.rand(64)
    torch.manual_seed(3)
    base = torch.nn.Linear(4, 3)
    with pytest.raises(TypeError, match=r"Linear.forward takes fewer inputs than the batch gives it .*a batch of 3 "
                                        r"items.*Keras's sample_weight\) give fit sample_weight=True"):
        dptrain.fit(copy.deepcopy(base), (X, y, w), epochs=1, batch_size=16, devices=1, log=None)
    plain = copy.deepcopy(base)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for i in range(0, 64, 16):
        opt.zero_grad()
        part = slice(i, i + 16)
        ((F.cross_entropy(plain(X[part]), y[part], reduction="none") * w[part]).sum() / w[part].sum()).backward()
        opt.step()
    for devices in (1, 2):
        model = copy.deepcopy(base)
        dptrain.fit(model, (X, y, w), epochs=1, batch_size=16, lr=0.1, devices=devices, log=None, shuffle=False,
                    forward=lambda model, batch: (model(batch[0]), batch[1]),
                    loss=lambda out, y, batch: ((F.cross_entropy(out, y, reduction='none') * batch[2]).sum(),
                                                batch[2].sum()))
        assert max((p - q).abs().max().item() for p, q in zip(model.parameters(), plain.parameters())) < 1e-6


def test_a_dict_input_whose_keys_name_no_argument_of_forward_is_an_error_naming_the_fix():
    """``({"x": X}, y)`` to ``nn.Sequential`` (whose forward takes ``input``) went whole and failed in
    torch's linear ("must be Tensor, not dict")."""
    import dptrain
    X, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    with pytest.raises(TypeError, match=r"Sequential.forward failed on the batch's input, a dict of the keys 'x', "
                                        r"given whole .*its keys name none of forward's arguments \(input\).*name "
                                        r"the keys after forward's arguments, or give the tensor itself"):
        dptrain.fit(torch.nn.Sequential(torch.nn.Linear(3, 2)), ({"x": X}, y), epochs=1, devices=1, log=None)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    dptrain.fit(model, ({"input": X}, y), epochs=1, devices=1, log=None)     # (named after the argument)
