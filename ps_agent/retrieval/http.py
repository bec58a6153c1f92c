"""An async client for Search-R1's retrieval protocol (this project's server, or Search-R1's own)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType

import httpx

from ps_agent.http_clients import LoopClients, server_reason
from ps_agent.retrieval.base import Passage


class RetrievalRejected(ValueError):
    """The server refused the request (a 4xx other than 408/429, or a redirect): the request is wrong, trying again
    cannot help."""

    transient = False  # read by resilient_search: not retried


class HTTPRetriever:
    """``POST {url}`` with ``{"queries", "topk", "return_scores": true}``; one pooled connection set per
    event loop, closed when that loop shuts down (``asyncio.run`` ends) or by ``aclose()``/``async with``.
    Timeouts, retries with backoff and throttling are the agent's (``resilient_search``)."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_connections: int = 64) -> None:
        parsed = httpx.URL(url)  # the path alone: ``?token=...`` stays where it is
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"retrieval server URL {url!r}: expected http://HOST:PORT[/retrieve]")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        path = parsed.path.rstrip("/")  # ".../retrieve/" got FastAPI's redirect, which the client does not follow
        self.url = str(parsed.copy_with(path=path if path.endswith("/retrieve") else path + "/retrieve"))
        self.timeout_s = timeout_s
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.ssl_context = httpx.create_ssl_context()  # built once (~70 ms), not by each loop's client
        self.clients = LoopClients(timeout=timeout_s, limits=self.limits, verify=self.ssl_context)

    async def aclose(self) -> None:
        """Close the running loop's connections (a later search opens new ones)."""
        await self.clients.aclose()

    async def __aenter__(self) -> HTTPRetriever:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        # json.dumps escapes to ASCII, so a query that is not valid Unicode reaches the server and gets its 422
        body = json.dumps({"queries": list(queries), "topk": k, "return_scores": True})
        client = await self.clients.get()
        response = await client.post(self.url, content=body, headers={"Content-Type": "application/json"})
        if response.status_code != 200:
            message = f"retrieval server {self.url} answered {response.status_code}: {server_reason(response)}"
            if 300 <= response.status_code < 500 and response.status_code not in (408, 429):
                raise RetrievalRejected(message)  # a redirect too: no retry reaches another URL
            raise RuntimeError(message)
        try:
            result = response.json()["result"]
            return [
                [Passage.from_contents(str(hit["document"]["id"]), hit["document"]["contents"], hit.get("score"))
                 for hit in hits]
                for hits in result
            ]  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:  # no retry makes this server speak Search-R1's JSON
            raise RetrievalRejected(
                f"retrieval server {self.url} answered 200 without Search-R1's JSON ({type(exc).__name__}: {exc}; "
                f'body {response.text[:200]!r}): expected {{"result": [[{{"document": {{"id", "contents"}}, '
                '"score"}, ...], ...]}'
            ) from None
