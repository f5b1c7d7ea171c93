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
