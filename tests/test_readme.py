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
