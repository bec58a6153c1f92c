"""The cache folder of converted models and built indexes, a file's checksum (the key of what is cached, and the
identity an eval records), and writing files or folders whole."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where converted models and built indexes are cached (``PS_AGENT_CACHE`` overrides)."""
    root = (
        os.environ.get("PS_AGENT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ps_agent"
    )
    return Path(root)


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A fresh path beside ``path`` to write a file or folder to, renamed onto ``path`` when the block completes.

    A crash never leaves a half-written cache, store, shard or index under the real name, and concurrent
    writers never share a partial path. A folder already at ``path`` is moved aside in one step, then
    deleted; if another writer's complete folder lands there first, that one is kept.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        partial = scratch / path.name
        yield partial
        if path.is_dir():
            with contextlib.suppress(FileNotFoundError):  # another writer moved it first
                os.replace(path, scratch / f"{path.name}.old")
        try:
            os.replace(partial, path)
        except OSError:
            if not (partial.is_dir() and path.is_dir()):
                raise
            logger.info("%s was written by another process meanwhile: keeping it", path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


#: A file modified at least this long ago is settled: a later write changes its modification time.
SETTLED_NS = 2_000_000_000


def file_checksum(path: str | Path) -> str:
    """sha1 of a file's bytes, to key caches and detect a changed corpus.

    A settled file is read once per process, as long as its path, size and modification time stay the same
    (an evaluation checksums a 540 MB model before its server starts and again when it runs). A file modified
    in the last two seconds is always read: a rewrite within the file system's timestamp granularity keeps
    the same modification time (git's "racily clean" rule)."""
    path = Path(path).resolve()
    stat = path.stat()
    if time.time_ns() - stat.st_mtime_ns < SETTLED_NS:
        return _sha1(path)
    return _settled_sha1(path, stat.st_size, stat.st_mtime_ns)


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=256)
def _settled_sha1(path: Path, size: int, mtime_ns: int) -> str:
    return _sha1(path)


def folder_checksum(path: str | Path) -> str:
    """sha1 over a folder's files, by relative path and content: a corpus folder, or a model retrained in place."""
    path = Path(path).resolve()
    digest = hashlib.sha1()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}:{file_checksum(file)}\n".encode())
    return digest.hexdigest()
