"""Find the dataset files on disk, or download them into the cache and verify them.

Look-up order for each file: ``--data-dir``, ``$DPTRAIN_DATA``, the user cache
(``$XDG_CACHE_HOME/dptrain`` or ``~/.cache/dptrain``), then ``/usr/share/datasets`` (Debian's
``dataset-fashion-mnist``). In each root both ``ROOT/<name>/FILE`` and ``ROOT/FILE`` count.
A download is checked against the SHA-256 of the *decompressed* content, because mirrors
(and Debian) re-gzip the same bytes with other headers.
"""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..core.atomic import atomic_file
from ..core.errors import DataNotFoundError, IDXError
from .idx import decompress

FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


@dataclass(frozen=True)
class DatasetSource:
    name: str
    mirrors: Tuple[str, ...]
    sha256: Dict[str, str]       # file name -> SHA-256 of its decompressed bytes


SOURCES = {
    "fashion-mnist": DatasetSource(
        "fashion-mnist",
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        {"train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
         "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
         "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
         "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"}),
    "mnist": DatasetSource(
        "mnist",
        ("https://ossci-datasets.s3.amazonaws.com/mnist/",
         "https://storage.googleapis.com/cvdf-datasets/mnist/"),
        {"train-images-idx3-ubyte.gz": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
         "train-labels-idx1-ubyte.gz": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
         "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
         "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"}),
}



def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dptrain"


def search_roots(data_dir: Optional[str] = None) -> List[Path]:
    """Return the directories searched, in order."""
    roots = []
    if data_dir:
        roots.append(Path(data_dir).expanduser())
    if os.environ.get("DPTRAIN_DATA"):
        roots.append(Path(os.environ["DPTRAIN_DATA"]).expanduser())
    roots += [cache_dir(), Path("/usr/share/datasets")]
    return roots


def _candidates(name: str, filename: str, roots: Sequence[Path]) -> List[Path]:
    out = []
    for root in roots:
        out += [root / name / filename, root / filename]
    return out


def mirrors_for(source: DatasetSource) -> List[str]:
    """Mirrors to try: ``$DPTRAIN_MIRROR`` (a base URL) instead of the official ones, if set."""
    mirror = os.environ.get("DPTRAIN_MIRROR")
    return [mirror.rstrip("/") + "/"] if mirror else list(source.mirrors)


def sha256_decompressed(raw: bytes, name: str) -> str:
    return hashlib.sha256(decompress(raw, name)).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file and a rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        f.write(data)


def download(source: DatasetSource, filename: str, dest_dir: Path,
             mirrors: Optional[Sequence[str]] = None, timeout: float = 30.0) -> Path:
    """Download one file into ``dest_dir``, verify its decompressed SHA-256, return its path."""
    errors = []
    for base in mirrors if mirrors is not None else mirrors_for(source):
        url = base + filename
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                raw = resp.read()
            digest = sha256_decompressed(raw, url)
        except (urllib.error.URLError, OSError, IDXError) as e:
            errors.append(f"{url}: {getattr(e, 'reason', e)}")
            continue
        if digest != source.sha256[filename]:
            errors.append(f"{url}: checksum mismatch (sha256 {digest[:12]}..., expected "
                          f"{source.sha256[filename][:12]}...)")
            continue
        path = dest_dir / source.name / filename
        atomic_write(path, raw)
        return path
    raise ConnectionError("; ".join(errors) or "no mirror to try")


def locate(name: str, data_dir: Optional[str] = None, allow_download: bool = True) -> Dict[str, Path]:
    """Return ``{file name: path}`` for the four files of dataset ``name``, downloading missing ones."""
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(SOURCES)}")
    source, roots = SOURCES[name], search_roots(data_dir)
    found, missing = {}, []
    for filename in FILES:
        hit = next((p for p in _candidates(name, filename, roots) if p.is_file()), None)
        if hit is None:
            missing.append(filename)
        else:
            found[filename] = hit
    if not missing:
        return found
    problems = []
    if allow_download:
        for filename in missing:
            try:
                found[filename] = download(source, filename, cache_dir())
            except (ConnectionError, OSError) as e:
                problems.append(f"download of {filename} failed: {e}")
                break
    else:
        problems.append("downloading is off")
    if len(found) == len(FILES):
        return found
    looked = ", ".join(str(r) for r in roots)
    debian = f"install Debian's dataset-{name} package, " if name == "fashion-mnist" else ""
    raise DataNotFoundError(
        f"{name}: missing {', '.join(f for f in FILES if f not in found)}; looked in {looked} "
        f"(each as ROOT/{name}/FILE and ROOT/FILE); {'; '.join(problems)}. Supply the files "
        f"with --data-dir DIR or DPTRAIN_DATA=DIR, {debian}or set DPTRAIN_MIRROR to a "
        f"reachable mirror")
