"""BM25 with ``bm25s`` over a passage list or an on-disk passage store, saved to / loaded from a folder."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import bm25s
from bm25s.tokenization import Tokenized, Tokenizer

from ps_agent.cache import written_whole
from ps_agent.retrieval.base import Passage
from ps_agent.retrieval.store import PassageStore

logger = logging.getLogger(__name__)


class BM25Retriever:
    """Lexical search (bm25s, English stopwords); passages with zero score are not returned.

    With ``cache``, the index is loaded from that folder, or built and saved there whole: an
    incomplete or corrupt folder (a crash of an older version) is rebuilt, never trusted.
    """

    def __init__(self, passages: Sequence[Passage], cache: str | Path | None = None) -> None:
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages = passages if isinstance(passages, PassageStore) else list(passages)
        self.tokenizer = Tokenizer(stopwords="en")
        cache = Path(cache) if cache else None
        if cache is not None and cache.exists():
            try:
                self._load(cache)
                return
            except Exception as err:  # any unreadable cache is rebuilt, not fatal
                logger.warning("BM25 cache %s is incomplete or corrupt (%r): rebuilding it", cache, err)
                self.tokenizer = Tokenizer(stopwords="en")
        self.index = bm25s.BM25()
        ids: list[list[int]] = []
        for texts in _contents(self.passages):  # tokenised in chunks into one vocabulary
            ids += self.tokenizer.tokenize(texts, update_vocab=True, show_progress=False, return_as="ids")
        self.index.index(Tokenized(ids=ids, vocab=self.tokenizer.get_vocab_dict()), show_progress=False)
        if cache is not None:
            self._save(cache)

    def _load(self, cache: Path) -> None:
        self.tokenizer.load_vocab(str(cache))
        self.index = bm25s.BM25.load(str(cache), show_progress=False)
        if self.index.scores["num_docs"] != len(self.passages):
            raise ValueError(f"it indexes {self.index.scores['num_docs']} passages, not {len(self.passages)}")

    def _save(self, cache: Path) -> None:
        """Write the index and vocabulary to a fresh sibling folder, then rename it onto ``cache`` whole."""
        with written_whole(cache) as partial:
            self.index.save(str(partial), show_progress=False)
            self.tokenizer.save_vocab(str(partial))
        logger.info("saved BM25 index of %d passages in %s", len(self.passages), cache)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages for each query (fewer when fewer match at all)."""
        k = min(k, len(self.passages))
        tokens = self.tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False)
        docs, scores = self.index.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        results = []
        for row, row_scores in zip(docs.tolist(), scores.tolist(), strict=True):
            hits = [(i, s) for i, s in zip(row, row_scores, strict=True) if s > 0]
            results.append([_scored(self.passages[i], s) for i, s in hits])
        return results

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return await asyncio.to_thread(self.search, queries, k)


def _scored(passage: Passage, score: float) -> Passage:
    return Passage(passage.id, passage.title, passage.text, float(score))


def _contents(passages: Sequence[Passage], chunk: int = 10_000) -> Iterator[list[str]]:
    if isinstance(passages, PassageStore):
        yield from passages.iter_contents(batch_size=chunk)
        return
    for start in range(0, len(passages), chunk):
        yield [p.contents for p in passages[start : start + chunk]]
