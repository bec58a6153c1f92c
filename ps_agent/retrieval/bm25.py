"""BM25 with ``bm25s`` over a passage list or an on-disk passage store, saved to / loaded from a folder.

Two fields, as BM25F and Lucene's multi-field queries score them: the passage (title and text) and the title
alone, each with its own length normalisation, summed with the title's weight. A query that names an article
("Paris", "Paris population") then finds that article before the many whose text mentions the name more often:
on HotpotQA's own corpus the supporting passages in the top 3 for the whole question go from 64% to 70%
(``benchmarks/retrieval.py --parts quality``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import bm25s
import numpy as np
from bm25s.tokenization import Tokenized, Tokenizer

from ps_agent.cache import written_whole
from ps_agent.retrieval.base import Passage, contents_title
from ps_agent.retrieval.store import PassageStore

logger = logging.getLogger(__name__)


class BM25Retriever:
    """Lexical search (bm25s, English stopwords); passages with zero score are not returned.

    ``title_weight`` weighs the title field against the whole passage; 0 searches the passage alone (one index,
    as before the title field). With ``cache``, the index is loaded from that folder, or built and saved there
    whole: an incomplete or corrupt folder (a crash of an older version), or one without the title field it
    needs, is rebuilt, never trusted.
    """

    def __init__(self, passages: Sequence[Passage], cache: str | Path | None = None, title_weight: float = 1.0) -> None:
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        if not title_weight >= 0:
            raise ValueError(f"title_weight must be a number >= 0, not {title_weight!r}")
        self.passages = passages if isinstance(passages, PassageStore) else list(passages)
        self.title_weight = float(title_weight)
        self.titles: bm25s.BM25 | None = None
        self.tokenizer = Tokenizer(stopwords="en")
        cache = Path(cache) if cache else None
        if cache is not None and cache.exists():
            try:
                self._load(cache)
                return
            except Exception as err:  # any unreadable cache is rebuilt, not fatal
                logger.warning("BM25 cache %s cannot be used (%s): rebuilding it", cache, err)
                self.tokenizer = Tokenizer(stopwords="en")
                self.titles = None
        ids: list[list[int]] = []
        title_ids: list[list[int]] = []
        for texts in _contents(self.passages):  # tokenised in chunks into one vocabulary, shared by both fields
            ids += self.tokenizer.tokenize(texts, update_vocab=True, show_progress=False, return_as="ids")
            if self.title_weight:
                titles = [contents_title(contents) for contents in texts]
                title_ids += self.tokenizer.tokenize(titles, update_vocab=True, show_progress=False, return_as="ids")
        vocab = self.tokenizer.get_vocab_dict()
        self.index = bm25s.BM25()
        self.index.index(Tokenized(ids=ids, vocab=vocab), show_progress=False)
        if self.title_weight:
            self.titles = bm25s.BM25()
            self.titles.index(Tokenized(ids=title_ids, vocab=vocab), show_progress=False)
        if cache is not None:
            self._save(cache)

    def _load(self, cache: Path) -> None:
        self.tokenizer.load_vocab(str(cache))
        self.index = bm25s.BM25.load(str(cache), show_progress=False)
        if self.index.scores["num_docs"] != len(self.passages):
            raise ValueError(f"it indexes {self.index.scores['num_docs']} passages, not {len(self.passages)}")
        if self.title_weight:
            if not (cache / _TITLES / "params.index.json").is_file():
                raise ValueError("it has no title field (built by an older version, or with title_weight 0)")
            self.titles = bm25s.BM25.load(str(cache / _TITLES), show_progress=False)
            if self.titles.scores["num_docs"] != len(self.passages):
                raise ValueError(f"its title field indexes {self.titles.scores['num_docs']} passages")

    def _save(self, cache: Path) -> None:
        """Write the index and vocabulary to a fresh sibling folder, then rename it onto ``cache`` whole."""
        with written_whole(cache) as partial:
            self.index.save(str(partial), show_progress=False)
            if self.titles is not None:
                self.titles.save(str(partial / _TITLES), show_progress=False)
            self.tokenizer.save_vocab(str(partial))
        logger.info("saved BM25 index of %d passages in %s", len(self.passages), cache)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages for each query (fewer when fewer match at all)."""
        k = min(k, len(self.passages))
        results: list[list[Passage]] = []
        empty = self.tokenizer.get_vocab_dict().get("")  # what bm25s makes of a text without a word to index
        for ids in self.tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False, return_as="ids"):
            ids = [i for i in ids if i != empty]
            if k < 1 or not ids:
                results.append([])
                continue
            scores = self.index.get_scores(ids)
            if self.titles is not None:
                scores = scores + self.title_weight * self.titles.get_scores(ids)
            kth = np.partition(scores, len(scores) - k)[len(scores) - k]
            top = np.flatnonzero((scores >= kth) & (scores > 0))  # the k best that match, and any tied with the k-th
            top = top[np.lexsort((top, -scores[top]))][:k]  # best first; ties in corpus order
            results.append([_scored(self.passages[int(i)], float(scores[i])) for i in top])
        return results

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return await asyncio.to_thread(self.search, queries, k)


_TITLES = "titles"  # the title field's bm25s files, in a subfolder of the index folder


def _scored(passage: Passage, score: float) -> Passage:
    return Passage(passage.id, passage.title, passage.text, float(score))


def _contents(passages: Sequence[Passage], chunk: int = 10_000) -> Iterator[list[str]]:
    if isinstance(passages, PassageStore):
        yield from passages.iter_contents(batch_size=chunk)
        return
    for start in range(0, len(passages), chunk):
        yield [p.contents for p in passages[start : start + chunk]]
