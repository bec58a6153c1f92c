"""Retrieval: the ``Retriever`` protocol, its backends, and spec resolution."""

from __future__ import annotations

import functools
import inspect
import threading
from pathlib import Path
from typing import Any

from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore

from ps_agent.cache import cache_dir, file_checksum
from ps_agent.retrieval.base import Passage, Retriever, SearchOutcome, resilient_search
from ps_agent.retrieval.bm25 import BM25Retriever
from ps_agent.retrieval.corpus import CorpusError, embedded_corpus_path, load_embedded_corpus
from ps_agent.retrieval.http import HTTPRetriever
from ps_agent.retrieval.langchain import LangChainRetriever, VectorStoreRetriever
from ps_agent.retrieval.store import load_jsonl_corpus

__all__ = [
    "BM25Retriever",
    "CorpusError",
    "Passage",
    "Retriever",
    "SearchOutcome",
    "bm25_for_corpus",
    "index_retriever",
    "resilient_search",
    "resolve_retriever",
]

EMBEDDED = "embedded"
_BUILD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def bm25_for_corpus(corpus: str = EMBEDDED) -> BM25Retriever:
    """A BM25 retriever over a corpus jsonl file, or the embedded corpus; built once, cached on disk."""
    if corpus == EMBEDDED:
        source = embedded_corpus_path()
        passages = load_embedded_corpus()
    else:
        source = Path(corpus)
        passages = load_jsonl_corpus(source)
    cache = cache_dir() / "bm25" / f"{source.stem}-{file_checksum(source)[:16]}"
    return BM25Retriever(passages, cache=cache)


@functools.lru_cache(maxsize=8)
def index_retriever(folder: str, kind: str | None = None) -> Retriever:
    """A built index folder (``ps-agent index build``), loaded once and checked against its manifest."""
    from ps_agent.retrieval.index import load_index  # FAISS and the encoders load only when a folder is used

    return load_index(folder, kind)


@functools.lru_cache(maxsize=8)
def _http_retriever(url: str) -> Retriever:
    return HTTPRetriever(url)  # one per URL, so its connection pool is shared by every search


def resolve_retriever(spec: Any = None) -> Retriever:
    """A ``Retriever`` from a spec: None or ``"embedded"`` (BM25 over the embedded corpus), a corpus
    jsonl path, a built index folder (``ps-agent index build``), a retrieval server URL
    (``http://HOST:PORT[/retrieve]``, Search-R1 protocol), a ``Retriever``, or a LangChain
    ``BaseRetriever``/``VectorStore``."""
    if spec is None or spec == EMBEDDED:
        spec = EMBEDDED
    if isinstance(spec, (str, Path)) and not str(spec).strip():
        raise ValueError("corpus is empty: expected 'embedded', a corpus jsonl path, an index folder or a server URL")
    if isinstance(spec, type):
        raise TypeError(f"cannot use the class {spec.__name__} as a retriever: expected an instance of it")
    if isinstance(spec, str) and spec.startswith(("http://", "https://")):
        return _http_retriever(spec)
    if isinstance(spec, (str, Path)) and (Path(spec) / "manifest.json").is_file():
        with _BUILD_LOCK:
            return index_retriever(str(Path(spec).resolve()))
    if isinstance(spec, (str, Path)):
        with _BUILD_LOCK:  # concurrent first runs build a corpus's index once
            return bm25_for_corpus(spec if spec == EMBEDDED else str(Path(spec).resolve()))
    if isinstance(spec, BaseRetriever):
        return LangChainRetriever(spec)
    if isinstance(spec, VectorStore):
        return VectorStoreRetriever(spec)
    if isinstance(spec, Retriever):
        if not inspect.iscoroutinefunction(spec.asearch):
            raise TypeError(
                f"{type(spec).__name__}.asearch is not a coroutine function: expected `async def asearch(queries, k)`"
            )
        return spec
    raise TypeError(
        f"cannot use {type(spec).__name__} as a retriever: expected None/'embedded', a corpus jsonl path, "
        "an object with `async asearch(queries, k)`, or a LangChain BaseRetriever or VectorStore"
    )
