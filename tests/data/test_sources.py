"""Finding and downloading dataset files, against a local HTTP server (never the internet)."""
import gzip
import hashlib
import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dptrain.data import sources
from dptrain.data.sources import FILES, DataNotFoundError, DatasetSource, download, locate

CLOSED = "http://127.0.0.1:9/"   # the discard port: nothing listens, connection refused


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve(tmp_path):
    """Serve a folder on loopback; yields a function folder -> base URL."""
    servers = []

    def start(folder):
        server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A made-up dataset 'tiny' whose files are known, with no reachable official mirror."""
    content = {f: f"contents of {f}".encode() for f in FILES}
    src = DatasetSource("tiny", (CLOSED,), {f: hashlib.sha256(c).hexdigest() for f, c in content.items()})
    monkeypatch.setitem(sources.SOURCES, "tiny", src)
    served = tmp_path / "mirror"
    served.mkdir()
    for f, c in content.items():
        (served / f).write_bytes(gzip.compress(c))
    return src, served, content


def test_download_verifies_the_decompressed_content(tiny, serve, tmp_path):
    src, served, content = tiny
    path = download(src, FILES[0], tmp_path / "dest", mirrors=[serve(served)])
    assert path == tmp_path / "dest" / "tiny" / FILES[0]
    assert gzip.decompress(path.read_bytes()) == content[FILES[0]]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".part")]


def test_regzipped_files_still_verify(tiny, serve, tmp_path):
    src, served, content = tiny
    # Another gzip header (as Debian ships): same content, other bytes.
    (served / FILES[0]).write_bytes(gzip.compress(content[FILES[0]], mtime=12345, compresslevel=1))
    assert download(src, FILES[0], tmp_path / "d", mirrors=[serve(served)]).is_file()


def test_checksum_mismatch_is_rejected_and_nothing_is_written(tiny, serve, tmp_path):
    src, served, _ = tiny
    (served / FILES[1]).write_bytes(gzip.compress(b"something else"))
    with pytest.raises(ConnectionError, match="checksum mismatch"):
        download(src, FILES[1], tmp_path / "d", mirrors=[serve(served)])
    assert not (tmp_path / "d" / "tiny" / FILES[1]).exists()


def test_locate_downloads_missing_files_into_the_cache(tiny, serve, monkeypatch, tmp_path):
    _, served, _ = tiny
    monkeypatch.setenv("DPTRAIN_MIRROR", serve(served))
    found = locate("tiny")
    assert set(found) == set(FILES)
    assert all(p.parent == tmp_path / "cache" / "dptrain" / "tiny" for p in found.values())
    # The second time the cache answers: no mirror needed.
    monkeypatch.setenv("DPTRAIN_MIRROR", CLOSED)
    assert locate("tiny") == found


def test_lookup_order_data_dir_then_env_then_cache(tiny, tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second" / "tiny"
    for folder in (first, second):
        folder.mkdir(parents=True)
        for f in FILES:
            (folder / f).write_bytes(b"x")
    monkeypatch.setenv("DPTRAIN_DATA", str(tmp_path / "second"))
    assert locate("tiny", data_dir=str(first))[FILES[0]] == first / FILES[0]
    assert locate("tiny")[FILES[0]] == second / FILES[0]


def test_without_network_the_error_names_every_place_looked(tiny, tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        locate("tiny", data_dir=str(tmp_path / "nowhere"))
    message = str(err.value)
    for place in (str(tmp_path / "nowhere"), str(tmp_path / "cache" / "dptrain"), "/usr/share/datasets"):
        assert place in message
    assert "--data-dir" in message and "DPTRAIN_DATA" in message and "download of" in message


def test_real_files_download_and_verify(data_dir, serve, monkeypatch, tmp_path):
    """The official Fashion-MNIST files, served locally, pass the real checksums."""
    mirror = tmp_path / "mirror"
    shutil.copytree(f"{data_dir}/fashion-mnist", mirror)
    monkeypatch.setitem(sources.SOURCES, "fashion-mnist",
                        DatasetSource("fashion-mnist", (serve(mirror),), sources.SOURCES["fashion-mnist"].sha256))
    found = locate("fashion-mnist")
    assert all(str(tmp_path / "cache") in str(p) for p in found.values())


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset 'cifar'; choose one of fashion-mnist, mnist"):
        locate("cifar")
