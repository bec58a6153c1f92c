"""A Search-R1-compatible retrieval server with cross-request micro-batching.

    ps-agent serve-retriever --index DIR [--host 127.0.0.1] [--port 8000]     (or --corpus FILE: BM25)

``POST /retrieve`` takes Search-R1's JSON (``{"queries": [...], "topk": k, "return_scores": bool}``) and
answers ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (documents alone when
``return_scores`` is false). Queries of concurrent requests are gathered for up to ``max_wait_ms`` or
``max_batch`` queries and searched together; a batch that fails is searched again one query at a time, so
one bad query fails only its own request. ``/health`` (with every limit: ``limits.py``) and Prometheus
``/metrics`` tell how it goes.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import asdict

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ps_agent.batching import MicroBatcher
from ps_agent.retrieval.base import Passage, Retriever
from ps_agent.retrieval.limits import ServerLimits, protocol_for
from ps_agent.text import lone_surrogates

logger = logging.getLogger(__name__)


#: the most queries a request model takes: a longer list is refused before any of its items is validated
QUERIES_CAP = 4096
#: passages per query where a request gives none, or null (Search-R1's server default)
DEFAULT_TOPK = 3


class RetrieveRequest(BaseModel):
    """Search-R1's request. Types are strict: ``"3"`` is not a topk, nor ``"yes"`` a bool."""

    model_config = ConfigDict(strict=True)

    # as Search-R1's server answers them: no queries (a turn where no rollout searched) get no results, an empty
    # query (``<search></search>``) gets none, and a topk of null the default
    queries: list[str] = Field(
        max_length=QUERIES_CAP, description="queries to search, UTF-8 text (an empty one gets no passages)"
    )
    topk: int | None = Field(
        default=DEFAULT_TOPK,
        ge=1,
        description=f"passages per query (null: {DEFAULT_TOPK}), at most ServerLimits.max_topk",
    )
    return_scores: bool = False

    @field_validator("queries")
    @classmethod
    def _searchable(cls, queries: list[str]) -> list[str]:
        for i, query in enumerate(queries):
            if found := lone_surrogates(query):  # a str that no tokenizer takes
                raise ValueError(
                    f"query {i} holds {found[0]!a} at character {found[1]} (surrogates not allowed): "
                    "expected text encodable as UTF-8"
                )
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


def create_app(retriever: Retriever, limits: ServerLimits | None = None) -> FastAPI:
    """The server around any ``Retriever``."""
    limits = limits or ServerLimits()
    if limits.max_queries > QUERIES_CAP:
        raise ValueError(f"ServerLimits.max_queries must be at most {QUERIES_CAP}, got {limits.max_queries}")
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

    async def search_batch(items: list[tuple[str, int]]) -> list[list[Passage]]:
        """One search for the queries of a batch, each result cut to its own request's ``topk``."""
        metrics["batches"].inc()
        metrics["batch_size"].observe(len(items))
        # one search per topk in the batch: a query's passages must not depend on which requests shared its batch
        # (a hybrid index fuses lists max(k, 20) deep, and an HNSW search's reach grows with k)
        by_k: dict[int, list[int]] = {}
        for i, (_, k) in enumerate(items):
            by_k.setdefault(k, []).append(i)
        results: list[list[Passage]] = [[] for _ in items]
        with metrics["batch_seconds"].time():
            for k, at in by_k.items():
                found = await retriever.asearch([items[i][0] for i in at], k)
                if len(found) != len(at):
                    raise ValueError(f"retriever returned {len(found)} result lists for {len(at)} queries")
                for i, passages in zip(at, found, strict=True):
                    results[i] = list(passages[:k])
        return results

    # a batch that fails is searched again one query at a time: one bad query fails only its own request
    batcher = MicroBatcher(search_batch, size=limits.max_batch, max_wait_s=limits.max_wait_ms / 1000, retry_alone=True)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The loaded model and index are millions of long-lived objects: frozen out of the cyclic collector,
        # so its full collections stop pausing batches (p99 at 64 clients: ~430 → ~200 ms on 2 cores).
        gc.collect()
        gc.freeze()
        yield
        await batcher.close()

    app = FastAPI(
        title="ParallelSearch retrieval server (Search-R1 protocol)",
        lifespan=lifespan,
        max_body_size=limits.max_body_bytes,
        strict_content_type=False,  # ``requests.post(url, data=json.dumps(...))`` sends JSON without saying so
    )
    in_flight = 0  # requests read whole and searched or waiting: one whose body never arrives holds no slot

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the input back: it may be large, or not encodable (a lone surrogate); and a
        # list of a million wrong-typed items would make a million errors: the first max_errors are enough
        found = exc.errors()
        errors = [{"loc": e["loc"], "msg": e["msg"], "type": e["type"]} for e in found[: limits.max_errors]]
        return JSONResponse({"detail": errors, "errors": len(found)}, status_code=422)

    @app.post("/retrieve", response_model=RetrieveResponse)
    async def retrieve(request: RetrieveRequest) -> RetrieveResponse:
        nonlocal in_flight
        problem = _check(request, limits)
        if problem:
            raise HTTPException(status_code=422, detail=problem)
        if in_flight >= limits.max_in_flight:
            detail = f"busy: {in_flight} requests in flight (at most {limits.max_in_flight}); retry after 1 s"
            raise HTTPException(status_code=503, detail=detail, headers={"Retry-After": "1"})
        in_flight += 1
        try:
            return await _answer(request)
        finally:
            in_flight -= 1

    async def _answer(request: RetrieveRequest) -> RetrieveResponse:
        # a query past max_query_chars is searched by its start (a rollout that rambled inside <search> fails
        # alone in Search-R1's client, which has no error handling: its whole batch would); an empty one is not
        topk = request.topk or DEFAULT_TOPK
        asked = [query[: limits.max_query_chars] for query in request.queries]
        items = [(query, topk) for query in asked if query.strip()]
        with metrics["latency"].time():
            try:  # each request alone without micro-batching, as Search-R1's server does
                found = (
                    await (batcher.submit(items) if limits.micro_batching else batcher.run_now(items)) if items else []
                )
            except Exception as exc:  # only this request fails
                logger.exception("retrieval of %d queries failed (the first: %.100r)", len(items), items[0][0])
                raise HTTPException(status_code=500, detail=f"search failed: {type(exc).__name__}: {exc}") from exc
        searched = iter(found)
        results = [next(searched) if query.strip() else [] for query in asked]
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
        return {"status": "ok", "micro_batching": limits.micro_batching, "limits": asdict(limits)}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _check(request: RetrieveRequest, limits: ServerLimits) -> str | None:
    """What is wrong with a request, against the limits, or None."""
    if len(request.queries) > limits.max_queries:
        return f"too many queries: {len(request.queries)} (at most {limits.max_queries} per request)"
    if request.topk is not None and request.topk > limits.max_topk:
        return f"topk {request.topk} out of bounds: expected 1..{limits.max_topk}"
    return None


def listening_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """The server's socket, bound before it starts: a port in use is an ``OSError`` the caller reports (uvicorn
    would log it and exit with its own status)."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)


def serve(app: FastAPI, limits: ServerLimits, listening: socket.socket) -> None:
    """Run ``app`` under uvicorn on ``listening`` (``listening_socket``), with ``limits``' read deadline and
    connection cap."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", http=protocol_for(limits))
    uvicorn.Server(config).run(sockets=[listening])
