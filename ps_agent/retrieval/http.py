"""An async client for Search-R1's retrieval protocol (this project's server, or Search-R1's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from ps_agent.retrieval.base import Passage


class HTTPRetriever:
    """``POST {url}`` with ``{"queries", "topk", "return_scores": true}``; one pooled connection set per
    event loop. Timeouts, retries with backoff and throttling are the agent's (``resilient_search``)."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_connections: int = 64) -> None:
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.timeout_s = timeout_s
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._clients: dict[int, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = id(asyncio.get_running_loop())
        if loop not in self._clients:
            self._clients[loop] = httpx.AsyncClient(timeout=self.timeout_s, limits=self.limits)
        return self._clients[loop]

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        response = await self._client().post(
            self.url, json={"queries": list(queries), "topk": k, "return_scores": True}
        )
        if response.status_code != 200:
            raise RuntimeError(f"retrieval server answered {response.status_code}: {response.text[:300]}")
        result = response.json()["result"]
        return [
            [Passage.from_contents(str(hit["document"]["id"]), hit["document"]["contents"], hit.get("score"))
             for hit in hits]
            for hits in result
        ]  # fmt: skip
