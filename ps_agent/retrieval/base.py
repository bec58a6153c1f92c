"""The retrieval seam: one async protocol that searches a batch of queries.

Every backend (BM25, LangChain retrievers and vector stores, FAISS and hybrid retrievers, the HTTP
client of the retrieval server) implements ``Retriever``; the agent only ever calls ``resilient_search``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from numbers import Real
from typing import Protocol, runtime_checkable

from asyncio_throttle import Throttler
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential


def contents_title(contents: str) -> str:
    """The title of a Search-R1/FlashRAG ``contents`` string (``"Title"\\ntext``): the quotes around it go, a quote
    of its own stays (2Wiki's ``"I Cannot Say "Farewell""``)."""
    line = contents.partition("\n")[0].strip()
    return line[1:-1] if len(line) > 1 and line[0] == line[-1] == '"' else line.strip('"')


@dataclass(frozen=True)
class Passage:
    """One retrieved passage; ``title`` and ``text`` are what the model reads."""

    id: str
    title: str
    text: str
    score: float | None = None

    @classmethod
    def from_contents(cls, id: str, contents: str, score: float | None = None) -> Passage:
        """Parse Search-R1/FlashRAG ``contents`` (``"Title"\\ntext``)."""
        if not isinstance(contents, str):
            raise TypeError(f"passage {id!r} has contents {contents!r:.80}: expected a str, '\"Title\"\\ntext'")
        title_line, _, text = contents.partition("\n")
        return cls(id=id, title=contents_title(title_line), text=text.strip(), score=score)

    @property
    def contents(self) -> str:
        """The Search-R1/FlashRAG ``contents`` form of this passage."""
        return f'"{self.title}"\n{self.text}'


@runtime_checkable
class Retriever(Protocol):
    """Searches a batch of queries, returning the top ``k`` passages for each, in order."""

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Passage]]: ...


@dataclass(frozen=True)
class SearchOutcome:
    """The result of one resilient search: passages, or the reason it failed."""

    passages: list[Passage]
    error: str | None
    attempts: int
    latency_s: float


class SearchFailed(RuntimeError):
    """A failed retriever call; a ``transient`` one (a timeout, a backend error) may succeed when tried again,
    one the backend refused (``exc.transient = False``, e.g. a 422 from the retrieval server) will not."""

    def __init__(self, message: str, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class MalformedResults(TypeError):
    """A retriever's answer of the wrong shape: asked again, it answers the same, so it is not retried."""

    transient = False


def _checked(results: object, k: int) -> list[Passage]:
    """The passages of a one-query search, or ``MalformedResults`` saying how the retriever's answer is malformed
    (a score must be a finite number or None: a NaN went into the records, whose JSON lines then could not be read
    back, and the run was lost from its eval)."""
    if not isinstance(results, Sequence) or isinstance(results, str) or len(results) != 1:
        is_lists = isinstance(results, Sequence) and not isinstance(results, str)
        shape = f"{len(results)} result lists" if is_lists else f"a {type(results).__name__}"
        raise MalformedResults(f"retriever returned {shape} for 1 query: expected a list of one list of Passage")
    passages = results[0]
    if not isinstance(passages, Sequence) or not all(isinstance(p, Passage) for p in passages):
        raise MalformedResults(f"retriever returned {passages!r:.120} for the query: expected a list of Passage")
    for p in passages:
        if not (isinstance(p.id, str) and isinstance(p.title, str) and isinstance(p.text, str)):
            expected = "a list of Passage with str id, title and text"
            raise MalformedResults(f"retriever returned {p!r:.120}: expected {expected}")
        number = isinstance(p.score, Real) and not isinstance(p.score, bool)
        if p.score is not None and not (number and isfinite(p.score)):
            raise MalformedResults(f"retriever returned {p!r:.120}: expected a score that is a finite number or None")
    return list(passages)[:k]


_throttlers: dict[tuple[int, int], Throttler] = {}
_kept: list[object] = []  # backends without weak references: kept alive, so that no other object takes their id


def throttler_for(backend: object, rate_limit: int) -> Throttler:
    """The throttler of ``backend`` at ``rate_limit`` searches per second: one per object, shared by every search
    on it whatever adapter wraps it, and dropped with the object (keyed by identity: LangChain retrievers are
    unhashable)."""
    key = (id(backend), rate_limit)
    if key not in _throttlers:
        _throttlers[key] = Throttler(rate_limit=rate_limit, period=1.0)
        try:
            weakref.finalize(backend, _throttlers.pop, key, None)
        except TypeError:  # no weak references (``__slots__``)
            _kept.append(backend)
    return _throttlers[key]


async def resilient_search(
    retriever: Retriever,
    query: str,
    k: int,
    *,
    timeout_s: float = 10.0,
    retries: int = 2,
    backoff_s: float = 0.2,
    rate_limit: int | None = None,
    backend: object = None,
    deadline: float | None = None,
) -> SearchOutcome:
    """Search one query with a per-attempt timeout, exponential backoff and an optional rate limit.

    ``rate_limit`` counts the searches per second on ``backend`` (default: ``retriever``; an adapter's caller
    passes the object it adapts, so that every adapter of one LangChain retriever shares its limit); the wait for
    it counts in the attempt's ``timeout_s``. ``deadline`` (``time.time()``) ends the retries and shortens the
    last attempt's timeout: the run's own budget. Never raises for backend faults: a search that fails every
    attempt returns its reason, so the agent can tell the model and go on.
    """
    start = time.perf_counter()
    throttler = throttler_for(retriever if backend is None else backend, rate_limit) if rate_limit else None
    attempts = 0

    async def throttled() -> list[list[Passage]]:
        await throttler.acquire()  # type: ignore[union-attr]
        return await retriever.asearch([query], k)

    async def attempt() -> list[Passage]:
        nonlocal attempts
        attempts += 1
        budget = timeout_s if deadline is None else min(timeout_s, deadline - time.time())
        if budget <= 0:
            raise SearchFailed("the run's time budget (run_timeout_s) is spent", transient=False)
        try:
            search = asyncio.ensure_future(throttled() if throttler is not None else retriever.asearch([query], k))
        except Exception as exc:  # asearch is not a coroutine function, or raised before its first await
            raise SearchFailed(f"{type(exc).__name__}: {exc}", getattr(exc, "transient", True)) from exc
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            # asyncio.wait, not asyncio.timeout: a search whose result is in when the timer fires is kept. And a
            # timer that fired late means something blocked the event loop (a sync call in another retriever):
            # that time is given back once, so the healthy searches beside a blocking one are not blamed for it
            await asyncio.wait([search], timeout=budget)
            blocked_s = loop.time() - started - budget
            if not search.done() and blocked_s > 0.01:
                await asyncio.wait([search], timeout=blocked_s)
        except asyncio.CancelledError:
            search.cancel()
            raise
        if not search.done():
            search.cancel()
            cut = " (the end of the run's time budget, run_timeout_s)" if budget < timeout_s else ""
            raise SearchFailed(f"timed out after {budget:.3g} s{cut}", transient=not cut)
        try:
            return _checked(search.result(), k)
        except asyncio.CancelledError as exc:  # the backend cancelled its own search (this run was not cancelled)
            raise SearchFailed("CancelledError: the retriever's search was cancelled") from exc
        except Exception as exc:  # any backend fault is retried, then reported to the model
            raise SearchFailed(f"{type(exc).__name__}: {exc}", getattr(exc, "transient", True)) from exc

    backoff = wait_exponential(multiplier=backoff_s, min=backoff_s, max=max(backoff_s, 5.0))

    def spent(state: RetryCallState) -> bool:  # no time left in the run for the backoff and another attempt
        return deadline is not None and deadline - time.time() <= backoff(state)

    try:
        async for attempt_state in AsyncRetrying(
            stop=stop_after_attempt(retries + 1) | spent,
            wait=backoff,
            retry=retry_if_exception(lambda exc: isinstance(exc, SearchFailed) and exc.transient),
            reraise=True,
        ):
            with attempt_state:
                passages = await attempt()
    except SearchFailed as exc:
        return SearchOutcome([], str(exc), attempts, time.perf_counter() - start)
    return SearchOutcome(passages, None, attempts, time.perf_counter() - start)
