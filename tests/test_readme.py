"""The README's "Your own model" code runs as written and learns."""
import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_your_own_model_snippet_runs(tmp_path, monkeypatch):
    text = README.read_text()
    section = text[text.index("## Your own model"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)            # noqa: S102 - our own README
    history = scope["result"]["history"]
    assert len(history) == 10 and history[-1]["train_loss"] < history[0]["train_loss"] / 2
    assert (tmp_path / "runs" / "own" / "checkpoint.pt").is_file()
    assert os.environ.get("WORLD_SIZE") is None


def test_callbacks_snippet_runs(tmp_path, monkeypatch):
    """The README's callbacks, on the "Your own model" data: the logger logs every 50 steps,
    and early stopping ends the run before its 60 epochs once the test loss stops improving."""
    text = README.read_text()
    first = re.search(r"```python\n(.*?)```", text[text.index("## Your own model"):], re.S).group(1)
    setup = first[:first.index("result = dptrain.fit(")]
    code = re.search(r"```python\n(.*?)```", text[text.index("### Callbacks"):], re.S).group(1)
    monkeypatch.chdir(tmp_path)
    lines = []
    scope = {"lines": lines}
    exec(compile(setup + code.replace("callbacks=[", "log=lines.append, progress=False, callbacks=["), "README.md",
                 "exec"), scope)                              # noqa: S102 - our own README
    history = scope["result"]["history"]
    assert "step 50: lr 0.003" in lines and "step 100: lr" in " ".join(lines)
    stopped = [line for line in lines if line.startswith("stopped after epoch")]
    assert len(history) < 60 and stopped == [f"stopped after epoch {len(history)}: test loss not better for 3 epochs"]


def test_built_in_callbacks_snippet_runs(tmp_path, monkeypatch):
    """The README's built-in callbacks, on a small classification task: the best weights
    file, the averaged weights, predict, both ways back, and the evaluated-average run."""
    import torch
    from torch import nn
    import dptrain
    text = README.read_text()
    code = re.search(r"```python\n(from dptrain.callbacks import.*?)```", text[text.index("### Callbacks"):],
                     re.S).group(1)
    monkeypatch.chdir(tmp_path)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(320, 6, generator=g)
    y = (X[:, 0] + X[:, 1] > 0).long()
    Net = lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))    # noqa: E731
    torch.manual_seed(0)
    model = Net()
    dptrain.fit(Net(), (X[:256], y[:256]), epochs=1, checkpoint_dir="runs/own", log=None, progress=False)
    lines = []
    scope = {"dptrain": dptrain, "Net": Net, "model": model, "lines": lines, "train": (X[:256], y[:256]), "test": (X[256:], y[256:])}
    exec(compile(code.replace("callbacks=[", "log=lines.append, progress=False, callbacks=["), "README.md", "exec"),
         scope)                                               # noqa: S102 - our own README
    assert len(scope["result"]["history"]) >= 4 and (tmp_path / "runs" / "best.pt").is_file()
    assert len(list((tmp_path / "runs").glob("top-*.pt"))) == min(3, len(scope["result"]["history"]))
    assert scope["outputs"].shape == (64, 2) and set(scope["figures"]) == {"test_loss", "test_acc"}
    assert [line for line in lines if line.startswith("restored the weights of epoch")]
    assert [line for line in lines if line.startswith("SWA: the model is the average of epochs 15-20")]
    assert scope["result"]["swa_epochs"] == 6


def test_several_models_snippet_trains_a_gan_on_two_devices():
    """The README's GAN loop, as written, on 2 devices: the generator moves its points
    towards the real ones."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    import dptrain
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index("**Several models and optimizers**"):], re.S).group(1)
    torch.manual_seed(0)
    latent = 4
    generator = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, 2))
    discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    real_points = torch.randn(2048, 2) * 0.3 + torch.tensor([2.0, -1.0])
    devices = [dptrain.cpu(0), dptrain.cpu(1)]
    before = generator(torch.randn(512, latent)).mean(0)
    scope = {"torch": torch, "F": F, "dptrain": dptrain, "generator": generator, "discriminator": discriminator,
             "devices": devices, "latent": latent,
             "loader": [real_points[i:i + 64] for i in range(0, 2048, 64)] * 15}
    exec(compile(code, "README.md", "exec"), scope)           # noqa: S102 - our own README
    after = generator(torch.randn(512, latent)).mean(0).detach()
    target = torch.tensor([2.0, -1.0])
    assert (after - target).norm() < 0.5 * (before - target).norm(), (before, after)


def test_gradient_histograms_snippet_runs():
    """The README's on_gradients callback, on 2 devices: a histogram of each parameter's
    gradient every 2 steps, of the plain loop's gradient there."""
    import torch
    from torch import nn
    import dptrain
    text = README.read_text()
    code = re.search(r"```python\n(class GradientHistograms.*?)```", text[text.index("### Callbacks"):],
                     re.S).group(1)
    scope = {"dptrain": dptrain}
    exec(compile(code, "README.md", "exec"), scope)           # noqa: S102 - our own README

    class Writer:
        def __init__(self):
            self.calls = []

        def add_histogram(self, tag, values, step):
            self.calls.append((tag, values.clone(), step))
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(64, 3, generator=g), torch.randint(0, 2, (64,), generator=g)
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    writer = Writer()
    dptrain.fit(model, (X, y), epochs=1, batch_size=16, shuffle=False, devices=2, log=None, progress=False,
                optimizer=lambda p: torch.optim.SGD(p, lr=0.1), callbacks=[scope["GradientHistograms"](writer, every=2)])
    assert [(tag, step) for tag, _, step in writer.calls] == [("grad/weight", 2), ("grad/bias", 2),
                                                              ("grad/weight", 4), ("grad/bias", 4)]
    opt, want = torch.optim.SGD(reference.parameters(), lr=0.1), []
    for i in range(4):
        opt.zero_grad()
        nn.functional.cross_entropy(reference(X[16 * i:16 * i + 16]), y[16 * i:16 * i + 16]).backward()
        if i % 2:
            want += [reference.weight.grad.clone(), reference.bias.grad.clone()]
        opt.step()
    for (_, got, _), grad in zip(writer.calls, want):
        torch.testing.assert_close(got, grad)


def test_ci_runs_the_readmes_test_command():
    """The README's first screen names the test command; CI (``.ci/run``) runs that command."""
    first_screen = README.read_text().split("```")[1]
    command = re.search(r"^(python -m pytest[^#\n]*?)\s*#", first_screen, re.M).group(1)
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert command in [line.strip() for line in ci if not line.startswith("#")], (command, ci)
