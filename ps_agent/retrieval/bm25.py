"""BM25 over a passage list with ``bm25s``, cached on disk by corpus checksum."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import bm25s
from bm25s.tokenization import Tokenizer

from ps_agent.retrieval.base import Passage

logger = logging.getLogger(__name__)


class BM25Retriever:
    """Lexical search (bm25s, English stopwords); passages with zero score are not returned."""

    def __init__(self, passages: Sequence[Passage], cache: str | Path | None = None) -> None:
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages = list(passages)
        self.tokenizer = Tokenizer(stopwords="en")
        cache = Path(cache) if cache else None
        if cache is not None and (cache / "params.index.json").is_file():
            self.tokenizer.load_vocab(str(cache))
            self.index = bm25s.BM25.load(str(cache), show_progress=False)
            return
        self.index = bm25s.BM25()
        tokens = self.tokenizer.tokenize(
            [f"{p.title} {p.text}" for p in self.passages], show_progress=False, return_as="tuple"
        )
        self.index.index(tokens, show_progress=False)
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            self.index.save(str(cache), show_progress=False)
            self.tokenizer.save_vocab(str(cache))
            (cache / "ids.json").write_text(json.dumps([p.id for p in self.passages]))
            logger.info("cached BM25 index of %d passages in %s", len(self.passages), cache)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages for each query (fewer when fewer match at all)."""
        k = min(k, len(self.passages))
        tokens = self.tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False)
        docs, scores = self.index.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [
            [
                Passage(self.passages[i].id, self.passages[i].title, self.passages[i].text, float(s))
                for i, s in zip(row, row_scores, strict=True)
                if s > 0
            ]
            for row, row_scores in zip(docs.tolist(), scores.tolist(), strict=True)
        ]

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return await asyncio.to_thread(self.search, queries, k)
