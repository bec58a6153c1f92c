"""HTTP clients pooled per event loop, closed when their loop shuts down, and a server's reason for a refusal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import httpx


class LoopClients:
    """One ``httpx.AsyncClient`` (a connection pool) per event loop, built with ``options``; closed when that
    loop shuts down its async generators (``asyncio.run`` ends) or by ``aclose()``."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        # keyed by the loop itself, not its id() (reused once a loop is collected): never a client of a dead loop
        self._clients: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, AsyncGenerator[None, None]]] = {}

    def __len__(self) -> int:
        return len(self._clients)

    async def get(self) -> httpx.AsyncClient:
        """The running loop's client, opened on first use."""
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            client = httpx.AsyncClient(**self.options)
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
        """Close the running loop's client (a later ``get`` opens a new one)."""
        entry = self._clients.get(asyncio.get_running_loop())
        if entry is not None:
            await entry[1].aclose()


def server_reason(response: httpx.Response, limit: int = 500) -> str:
    """What a server said when it refused: FastAPI's ``detail`` (a message, or its validation errors), vLLM's and
    OpenAI's ``message`` (at the top or under ``error``), else the body; httpx's own message names the status only."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:limit]
    if isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else {}
        for said in (body.get("detail"), body.get("message"), error.get("message")):
            if isinstance(said, list) and said and all(isinstance(e, dict) for e in said):
                said = "; ".join(f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}" for e in said)
            if said:  # the first that says something: a null or empty one does not hide the next
                return str(said)[:limit]
    return response.text[:limit]
