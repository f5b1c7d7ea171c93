import pytest

from dptrain.core.atomic import atomic_file


def test_replaces_only_when_the_block_succeeds(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_file(path) as f:
            f.write(b"half")
            raise RuntimeError("crash")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]        # no temp file left behind
    with atomic_file(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new"
