"""What the retrieval server refuses, and when: its limits, and the read deadline uvicorn does not bring.

- request shape: at most ``max_queries`` queries, checked before any item is validated (``RetrieveRequest``),
  and at most ``max_errors`` errors in a 422 body;
- body size: ``max_body_bytes``, FastAPI's own ``max_body_size`` (413);
- concurrency: at most ``max_in_flight`` requests, read whole, searched or waiting at once; more get a 503 with
  ``Retry-After`` (counted in the ``/retrieve`` handler, so a request whose body never arrives holds no slot);
- reading: a request's headers and body must arrive within ``read_timeout_s`` of its first byte, or of the
  connection's start, else the connection is closed; when ``max_connections`` are open, a new connection
  closes the one that has been reading its request longest (``ReadDeadlineProtocol``);
- fairness: each batch takes the waiting requests' queries in turn (``MicroBatcher``), so a heavy client
  shares batches with the others instead of going first.

``/health`` reports every limit; ``ps-agent serve-retriever --help`` has a flag for each but the request shape's.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class ServerLimits:
    """One place for the server's limits."""

    max_queries: int = 4096  # Search-R1 sends a training batch's every rollout in one request (its example: 400)
    max_topk: int = 100
    max_query_chars: int = 2000
    max_batch: int = 256
    max_wait_ms: float = 5.0
    micro_batching: bool = True
    max_body_bytes: int = 4 * 1024 * 1024  # 256 queries of 2,000 characters, JSON-escaped
    max_errors: int = 20
    max_in_flight: int = 64
    read_timeout_s: float = 10.0
    max_connections: int = 512

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            zero_ok = name == "max_wait_ms"  # a batch may leave at once: it holds what queued meanwhile
            if not isinstance(value, bool) and not ((value >= 0 if zero_ok else value > 0) and math.isfinite(value)):
                raise ValueError(
                    f"ServerLimits.{name} must be a finite number {'>=' if zero_ok else '>'} 0, got {value!r}"
                )


class ReadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a read deadline: a request not read whole within ``read_timeout_s`` of its
    first byte (or of the connection's start) closes its connection (uvicorn waits forever for slow headers and
    bodies; between requests its keep-alive timeout closes an idle connection), and past
    ``max_connections`` a new connection closes the one that has been reading longest. A request read whole is
    never cut: searching it and writing the answer take what they take."""

    read_timeout_s = 10.0
    max_connections = 512

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reading_since: float | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._start_reading()  # the first request's bytes must come; later ones are timed from their first byte
        if len(self.connections) > self.max_connections:
            reading = [c for c in self.connections if getattr(c, "_reading_since", None) is not None]
            oldest = min(reading, key=lambda c: c._reading_since, default=None)  # type: ignore[attr-defined]
            if oldest is not None:
                oldest._read_timed_out()  # type: ignore[attr-defined]

    def _start_reading(self) -> None:
        self._stop_reading()
        self._reading_since = time.monotonic()
        self._deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _stop_reading(self) -> None:
        self._reading_since = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._stop_reading()
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_reading()  # a request (a pipelined one too) is timed from its first byte to its last

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._stop_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reading()
        super().connection_lost(exc)


def protocol_for(limits: ServerLimits) -> type[ReadDeadlineProtocol]:
    """``ReadDeadlineProtocol`` with ``limits``' read timeout and connection cap (uvicorn takes a class)."""
    settings = {"read_timeout_s": limits.read_timeout_s, "max_connections": limits.max_connections}
    return type("ReadDeadlineProtocol", (ReadDeadlineProtocol,), settings)
