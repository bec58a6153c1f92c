"""Adapters between LangChain retrieval objects and the ``Retriever`` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore
from pydantic import Field, field_validator

from ps_agent.retrieval.base import Passage, contents_title
from ps_agent.retrieval.corpus import passage_id
from ps_agent.runner import run_sync


def document_to_passage(doc: Document, score: float | None = None) -> Passage:
    """A LangChain ``Document`` as a passage: title from ``metadata['title']`` or the first line."""
    title = doc.metadata.get("title")
    text = doc.page_content
    if title is None:
        first, _, rest = text.partition("\n")
        title, text = (contents_title(first), rest.strip()) if rest.strip() else ("", text)
    pid = next((str(i) for i in (doc.id, doc.metadata.get("id")) if i is not None and str(i)), None)
    pid = pid or passage_id(title, text)
    return Passage(id=str(pid), title=str(title), text=text, score=score)


class LangChainRetriever:
    """Any LangChain ``BaseRetriever`` (its own ``k`` applies; results are cut to ``k``)."""

    def __init__(self, retriever: BaseRetriever) -> None:
        self.retriever = retriever

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        batches = await self.retriever.abatch(list(queries))
        return [[document_to_passage(d) for d in docs[:k]] for docs in batches]


class VectorStoreRetriever:
    """Any LangChain ``VectorStore``, searched by similarity with scores."""

    def __init__(self, store: VectorStore) -> None:
        self.store = store

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        results = []
        for query in queries:
            hits = await self.store.asimilarity_search_with_score(query, k=k)
            results.append([document_to_passage(doc, float(score)) for doc, score in hits])
        return results


class PassageRetriever(BaseRetriever):
    """Any ``Retriever`` of this project (BM25, the HTTP client, …) as a LangChain ``BaseRetriever``."""

    retriever: Any
    k: int = Field(default=3, ge=1)

    @field_validator("retriever", mode="before")
    @classmethod
    def _resolved(cls, retriever: Any) -> Any:
        """A retriever, or a spec of one (``"embedded"``, a corpus path, an index folder, a server URL)."""
        from ps_agent.retrieval import resolve_retriever

        return resolve_retriever(retriever)

    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return run_sync(self._aget_relevant_documents(query, run_manager=run_manager))

    async def _aget_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        (passages,) = await self.retriever.asearch([query], self.k)
        return [Document(page_content=p.text, id=p.id, metadata={"title": p.title, "score": p.score}) for p in passages]
