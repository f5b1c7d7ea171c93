"""Every row of docs/errors.md: the command gives the exit code and the message it shows."""
import gzip
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
ROW = re.compile(r"^\| (?P<what>[^|]+) \| `(?P<cmd>(?:[A-Z_]+=\S+ )*dptrain [^`]+)` \| (?P<code>\d+) \| (?P<msg>.+) \|$")
ROWS = [m.groupdict() for m in map(ROW.match, DOC.read_text().splitlines()) if m]


def test_the_table_is_read():
    assert len(ROWS) >= 20


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The folders and files the rows name, made once for all rows."""
    from tests.conftest import real_data_dir
    data_dir = real_data_dir()
    if data_dir is None:
        pytest.skip("real datasets not found")
    tmp_path = tmp_path_factory.mktemp("places")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    data_dir = str(data_dir)
    trunc = tmp_path / "trunc" / "fashion-mnist"
    shutil.copytree(Path(data_dir) / "fashion-mnist", trunc)
    target = trunc / "t10k-labels-idx1-ubyte.gz"
    target.write_bytes(target.read_bytes()[:-50])
    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    shutil.copytree(Path(data_dir) / "mnist", data / "mnist-as-fashion" / "fashion-mnist")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    ckpt = tmp_path / "ckpt"
    subprocess.run([sys.executable, "-m", "dptrain", "train", "--data-dir", str(data), "--epochs", "1",
                    "--max-batches", "1", "--eval-batches", "1", "--checkpoint-dir", str(ckpt)],
                   check=True, capture_output=True, timeout=120)
    bad = tmp_path / "badckpt"
    bad.mkdir()
    (bad / "checkpoint.pt").write_bytes(gzip.compress(b"not a checkpoint"))
    yield {"data": str(data), "tmp": str(tmp_path / "empty"), "file": str(tmp_path / "file"),
           "trunc": str(tmp_path / "trunc"), "ckpt": str(ckpt), "badckpt": str(bad),
           "busyport": str(busy.getsockname()[1])}
    busy.close()


@pytest.mark.parametrize("row", ROWS, ids=[r["what"] for r in ROWS])
def test_row(row, places, tmp_path):
    words = shlex.split(row["cmd"].format(**places))
    assignments = [w for w in words[:words.index("dptrain")]]
    args = words[words.index("dptrain") + 1:]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "DPTRAIN_MIRROR": "http://127.0.0.1:9/",
           **dict(a.split("=", 1) for a in assignments)}
    out = subprocess.run([sys.executable, "-m", "dptrain", *args], capture_output=True, text=True,
                         timeout=300, env=env)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("dptrain: error: ")]
    assert out.returncode == int(row["code"]), out.stderr
    assert len(lines) == 1 and row["msg"].format(**places) in lines[0], out.stderr
    assert "Traceback" not in out.stderr
