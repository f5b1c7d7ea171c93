import pytest

from dptrain.run.config import TrainConfig


def test_defaults_are_valid():
    assert TrainConfig().recipe == "lenet-scratch"


@pytest.mark.parametrize("kw, message", [
    (dict(epochs=0), "epochs must be a whole number >= 1, got 0"),
    (dict(batch_size=-3), "batch-size must be a whole number >= 1, got -3"),
    (dict(max_batches=1.5), "max-batches must be a whole number >= 1, got 1.5"),
    (dict(lr=0.0), "lr must be a finite number > 0, got 0.0"),
    (dict(lr=float("nan")), "lr must be a finite number > 0"),
    (dict(allreduce="tree"), "unknown allreduce algorithm 'tree'"),
    (dict(clip_grad_norm=0.0), "clip-grad-norm must be a finite number > 0, got 0.0"),
    (dict(clip_grad_value=-1.0), "clip-grad-value must be a finite number > 0, got -1.0"),
])
def test_bad_values(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kw)


def test_unknown_keys_are_rejected_not_ignored():
    with pytest.raises(ValueError, match="unknown config key.s. learning rate; valid keys: .*lr"):
        TrainConfig.from_dict({"learning rate": 0.1})
    assert TrainConfig.from_dict({"lr": 0.1}).lr == 0.1
