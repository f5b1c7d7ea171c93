"""The notebooks in examples/ run, on a few batches, and are committed without outputs."""
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.ipynb"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_notebook_runs(path, data_dir, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    monkeypatch.setenv("DPTRAIN_EXAMPLE_BATCHES", "3")
    monkeypatch.setenv("DPTRAIN_DATA", data_dir)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "test acc:" in text and "sec/epoch on" in text
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())
