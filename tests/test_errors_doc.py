"""Every row of docs/errors.md: the command gives the exit code and the one line it shows."""
import gzip
import http.server
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.warm import dptrain_cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
ROW = re.compile(r"^\| (?P<what>[^|]+) \| `(?P<cmd>(?:[A-Z_]+=\S+ )*dptrain [^`]+)` \| (?P<code>\d+) \| (?P<msg>.+) \|$")
ROWS = [m.groupdict() for m in map(ROW.match, DOC.read_text().splitlines()) if m]


def test_the_table_is_read():
    assert len(ROWS) >= 50


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _small_disk(path: Path):
    """A 200 kB tmpfs (root only, as in CI); None where it cannot be mounted."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        return None
    return path


def _copy(source: Path, target: Path, change, digest: bool = True, fmt: str = "") -> None:
    """A copy of a checkpoint with ``change(state)`` applied, its digest redone (or the old one
    kept: the file then changed after its save), in another format if ``fmt``."""
    from dptrain.outputs.checkpoint import FORMAT, digest as digest_of, load_checkpoint
    state = load_checkpoint(source)
    before = digest_of(state)
    change(state)
    target.mkdir(parents=True)
    torch.save({"format": fmt or FORMAT, "digest": digest_of(state) if digest else before, **state},
               target / "checkpoint.pt")


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The folders, files and servers the rows name, made once for all rows."""
    from tests.conftest import real_data_dir
    data_dir = real_data_dir()
    if data_dir is None:
        pytest.skip("real datasets not found")
    tmp_path = tmp_path_factory.mktemp("places")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
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
    metrics = tmp_path / "metrics.jsonl"
    made = dptrain_cli(["train", "--data-dir", str(data), "--epochs", "2", "--max-batches", "1", "--eval-batches",
                        "1", "--checkpoint-dir", str(ckpt), "--metrics", str(metrics)], timeout=120)
    assert made.returncode == 0, made.stderr
    bad = tmp_path / "badckpt"
    bad.mkdir()
    (bad / "checkpoint.pt").write_bytes(gzip.compress(b"not a checkpoint"))
    _copy(ckpt, tmp_path / "flipped", lambda s: s["engine"]["model"]["params.0"].mul_(1e5), digest=False)
    _copy(ckpt, tmp_path / "midepoch", lambda s: s.update(epoch=2, batch=3))
    _copy(ckpt, tmp_path / "oldckpt", lambda s: None, fmt="dptrain-checkpoint-1")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "noepoch.jsonl").write_text('{"train_loss": 1.0}\n')
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "notask.py").write_text("def make(config):\n    return 42\n")
    disk = _small_disk(tmp_path / "disk")
    yield {"data": str(data), "tmp": str(tmp_path / "empty"), "file": str(tmp_path / "file"),
           "trunc": str(tmp_path / "trunc"), "ckpt": str(ckpt), "badckpt": str(bad),
           "busyport": str(busy.getsockname()[1]), "freeport": str(_free_port()),
           "httpport": str(web.server_address[1]), "metrics": str(metrics),
           "flipped": str(tmp_path / "flipped"), "midepoch": str(tmp_path / "midepoch"),
           "oldckpt": str(tmp_path / "oldckpt"), "list": str(tmp_path / "list.jsonl"),
           "noepoch": str(tmp_path / "noepoch.jsonl"), "binary": str(tmp_path / "binary.jsonl"),
           "notask": str(tmp_path / "notask.py"), "smalldisk": str(disk) if disk else None}
    web.shutdown()
    busy.close()
    if disk:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("row", ROWS, ids=[r["what"] for r in ROWS])
def test_row(row, places, tmp_path):
    if "{smalldisk}" in row["cmd"] and places["smalldisk"] is None:
        pytest.skip("a small tmpfs needs root")
    words = shlex.split(row["cmd"].format(**places))
    assignments = [w for w in words[:words.index("dptrain")]]
    args = words[words.index("dptrain") + 1:]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "DPTRAIN_MIRROR": "http://127.0.0.1:9/",
           **dict(a.split("=", 1) for a in assignments)}
    start = time.monotonic()
    out = dptrain_cli(args, env=env, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("dptrain: error: ")]
    assert out.returncode == int(row["code"]), out.stderr
    assert len(lines) == 1 and row["msg"].format(**places) in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    if "--timeout" in args:             # bounded, as documented: the wait plus start-up
        assert time.monotonic() - start < float(args[args.index("--timeout") + 1]) + 30
