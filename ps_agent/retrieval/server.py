"""A Search-R1-compatible retrieval server with cross-request micro-batching.

    ps-agent serve-retriever --index DIR [--host 127.0.0.1] [--port 8000]     (or --corpus FILE: BM25)

``POST /retrieve`` takes Search-R1's JSON (``{"queries": [...], "topk": k, "return_scores": bool}``) and
answers ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (documents alone when
``return_scores`` is false). Queries of concurrent requests are gathered for up to ``max_wait_ms`` or
``max_batch`` queries and searched together; a batch that fails is searched again one query at a time, so
one bad query fails only its own request. ``/health`` and Prometheus ``/metrics`` tell how it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ps_agent.retrieval.base import Passage, Retriever

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """One place for the server's limits."""

    max_queries: int = 256
    max_topk: int = 100
    max_query_chars: int = 2000
    max_batch: int = 256
    max_wait_ms: float = 5.0
    micro_batching: bool = True


class RetrieveRequest(BaseModel):
    """Search-R1's request. Types are strict: ``"3"`` is not a topk, nor ``"yes"`` a bool."""

    model_config = ConfigDict(strict=True)

    queries: list[str] = Field(min_length=1, description="queries to search, each non-empty UTF-8 text")
    topk: int = Field(default=3, ge=1, description="passages per query, at most ServerLimits.max_topk")
    return_scores: bool = False

    @field_validator("queries")
    @classmethod
    def _searchable(cls, queries: list[str]) -> list[str]:
        for i, query in enumerate(queries):
            if not query.strip():
                raise ValueError(f"query {i} is empty: expected a non-empty string")
            try:  # a lone surrogate ("\ud800" in JSON) is a str that no tokenizer takes
                query.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"query {i} holds {exc.object[exc.start]!r} at character {exc.start} ({exc.reason}): "
                    "expected text encodable as UTF-8"
                ) from None
        return queries


class Document(BaseModel):
    id: str
    contents: str


class ScoredDocument(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    """Search-R1's response: one list per query, in order."""

    result: list[list[ScoredDocument]] | list[list[Document]]


class MicroBatcher:
    """Gathers the queries of concurrent requests and searches them as one batch."""

    def __init__(self, retriever: Retriever, limits: ServerLimits, metrics: dict) -> None:
        self.retriever = retriever
        self.limits = limits
        self.metrics = metrics
        self._queue: list[tuple[str, int, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None

    async def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in queries]
        if not self.limits.micro_batching:  # each request alone, as Search-R1's server does
            await self._run_batch([(q, k, f) for q, f in zip(queries, futures, strict=True)])
        else:
            self._queue += [(q, k, f) for q, f in zip(queries, futures, strict=True)]
            if self._worker is None or self._worker.done():
                self._worker = asyncio.create_task(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        while self._queue:
            if len(self._queue) < self.limits.max_batch:
                await asyncio.sleep(self.limits.max_wait_ms / 1000)
            batch, self._queue = self._queue[: self.limits.max_batch], self._queue[self.limits.max_batch :]
            await self._run_batch(batch)

    async def _run_batch(self, batch: list[tuple[str, int, asyncio.Future]]) -> None:
        self.metrics["batches"].inc()
        self.metrics["batch_size"].observe(len(batch))
        k = max(k for _, k, _ in batch)
        try:
            with self.metrics["batch_seconds"].time():
                results = await self.retriever.asearch([q for q, _, _ in batch], k)
            if len(results) != len(batch):
                raise ValueError(f"retriever returned {len(results)} result lists for {len(batch)} queries")
        except Exception as exc:
            if len(batch) > 1:  # one bad query must not fail the requests batched with it: search each alone
                logger.warning("batch of %d failed (%r); searching its queries one at a time", len(batch), exc)
                for item in batch:
                    if not item[2].done():
                        await self._run_batch([item])
                return
            logger.exception("retrieval of query %.100r failed", batch[0][0])
            if not batch[0][2].done():
                batch[0][2].set_exception(exc)
            return
        for (_, k_query, future), passages in zip(batch, results, strict=True):
            if not future.done():  # a client that went away has cancelled its future
                future.set_result(passages[:k_query])

    async def close(self) -> None:
        """Let in-flight requests finish."""
        if self._worker is not None:
            await self._worker


def create_app(retriever: Retriever, limits: ServerLimits | None = None) -> FastAPI:
    """The server around any ``Retriever``."""
    limits = limits or ServerLimits()
    registry = CollectorRegistry()
    metrics = {
        "requests": Counter("retrieve_requests", "POST /retrieve requests served", registry=registry),
        "queries": Counter("retrieve_queries", "queries searched", registry=registry),
        "batches": Counter("retrieve_batches", "search batches run", registry=registry),
        "batch_size": Histogram(
            "retrieve_batch_size", "queries per batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=registry
        ),
        "batch_seconds": Histogram("retrieve_batch_seconds", "time to search one batch", registry=registry),
        "latency": Histogram("retrieve_latency_seconds", "request latency", registry=registry),
    }
    batcher = MicroBatcher(retriever, limits, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The loaded model and index are millions of long-lived objects: frozen out of the cyclic collector,
        # so its full collections stop pausing batches (p99 at 64 clients: ~430 → ~200 ms on 2 cores).
        gc.collect()
        gc.freeze()
        yield
        await batcher.close()

    app = FastAPI(title="ParallelSearch retrieval server (Search-R1 protocol)", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the input back: it may be large, or not encodable (a lone surrogate)
        errors = [{"loc": e["loc"], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.post("/retrieve", response_model=RetrieveResponse)
    async def retrieve(request: RetrieveRequest) -> RetrieveResponse:
        problem = _check(request, limits)
        if problem:
            raise HTTPException(status_code=422, detail=problem)
        with metrics["latency"].time():
            try:
                results = await batcher.search(request.queries, request.topk)
            except Exception as exc:  # logged by the batcher; only this request fails
                raise HTTPException(status_code=500, detail=f"search failed: {type(exc).__name__}: {exc}") from exc
        metrics["requests"].inc()
        metrics["queries"].inc(len(request.queries))
        if request.return_scores:
            return RetrieveResponse(
                result=[
                    [ScoredDocument(document=Document(id=p.id, contents=p.contents), score=p.score or 0.0) for p in ps]
                    for ps in results
                ]
            )
        return RetrieveResponse(result=[[Document(id=p.id, contents=p.contents) for p in ps] for ps in results])

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "micro_batching": limits.micro_batching}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _check(request: RetrieveRequest, limits: ServerLimits) -> str | None:
    """What is wrong with a request, against the limits, or None."""
    if len(request.queries) > limits.max_queries:
        return f"too many queries: {len(request.queries)} (at most {limits.max_queries} per request)"
    if request.topk > limits.max_topk:
        return f"topk {request.topk} out of bounds: expected 1..{limits.max_topk}"
    for i, query in enumerate(request.queries):
        if len(query) > limits.max_query_chars:
            return f"query {i} has {len(query)} characters: at most {limits.max_query_chars}"
    return None
