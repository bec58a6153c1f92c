"""The cache folder of converted models and built indexes, and writing files or folders whole."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
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
