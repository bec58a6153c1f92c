"""An async client for Search-R1's retrieval protocol (this project's server, or Search-R1's own)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType

import httpx

from ps_agent.retrieval.base import Passage


class RetrievalRejected(ValueError):
    """The server refused the request (a 4xx other than 408/429): the request is wrong, trying again cannot help."""

    transient = False  # read by resilient_search: not retried


class HTTPRetriever:
    """``POST {url}`` with ``{"queries", "topk", "return_scores": true}``; one pooled connection set per
    event loop, closed when that loop shuts down (``asyncio.run`` ends) or by ``aclose()``/``async with``.
    Timeouts, retries with backoff and throttling are the agent's (``resilient_search``)."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_connections: int = 64) -> None:
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.timeout_s = timeout_s
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.ssl_context = httpx.create_ssl_context()  # built once (~70 ms), not by each loop's client
        # keyed by the loop itself, not its id() (reused once a loop is collected): never a client of a dead loop
        self._clients: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, AsyncGenerator]] = {}

    async def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            client = httpx.AsyncClient(timeout=self.timeout_s, limits=self.limits, verify=self.ssl_context)
            closer = self._close_at_loop_shutdown(client)
            self._clients[loop] = (client, closer)
            await anext(closer)  # started: the loop finalises it when it shuts down its async generators
        return self._clients[loop][0]

    async def _close_at_loop_shutdown(self, client: httpx.AsyncClient) -> AsyncGenerator[None, None]:
        """Waits at its ``yield`` until the loop shuts down (or ``aclose()``), then forgets and closes the client."""
        try:
            yield
        finally:
            del self._clients[asyncio.get_running_loop()]
            await client.aclose()

    async def aclose(self) -> None:
        """Close the running loop's connections (a later search opens new ones)."""
        if asyncio.get_running_loop() in self._clients:
            await self._clients[asyncio.get_running_loop()][1].aclose()

    async def __aenter__(self) -> HTTPRetriever:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        # json.dumps escapes to ASCII, so a query that is not valid Unicode reaches the server and gets its 422
        body = json.dumps({"queries": list(queries), "topk": k, "return_scores": True})
        client = await self._client()
        response = await client.post(self.url, content=body, headers={"Content-Type": "application/json"})
        if response.status_code != 200:
            message = f"retrieval server answered {response.status_code}: {_detail(response)}"
            if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                raise RetrievalRejected(message)
            raise RuntimeError(message)
        result = response.json()["result"]
        return [
            [Passage.from_contents(str(hit["document"]["id"]), hit["document"]["contents"], hit.get("score"))
             for hit in hits]
            for hits in result
        ]  # fmt: skip


def _detail(response: httpx.Response) -> str:
    """The server's reason: FastAPI's ``detail`` (a message, or a list of validation errors), else the body."""
    try:
        detail = response.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
    if isinstance(detail, list) and all(isinstance(e, dict) for e in detail):
        detail = "; ".join(f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}" for e in detail)
    return str(detail)[:500]
