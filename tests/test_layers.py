"""The layers of ``src/dptrain`` (pyproject's ``[tool.importlinter]``) hold: no module
imports a layer above its own, checked by import-linter on the installed tree."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def lint(cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is missing: pip install -e .[dev] installs import-linter")
    return subprocess.run([exe, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_layer_contract_holds():
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_it(tmp_path):
    """The contract can fail: a copy of the tree where core imports run is refused."""
    shutil.copytree(REPO / "src", tmp_path / "src")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    bad = tmp_path / "src" / "dptrain" / "core" / "violation.py"
    bad.write_text("from ..run import loop  # noqa: F401\n")
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'src'); "
                          "from importlinter.cli import lint_imports_command; lint_imports_command()",
                          "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "dptrain.core is not allowed to import dptrain.run" in out.stdout
    assert "dptrain.core.violation -> dptrain.run.loop" in out.stdout
