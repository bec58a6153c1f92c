"""One micro-batcher: items submitted concurrently on an event loop are run together, in batches.

Used by the retrieval server (the queries of concurrent requests → one search) and the in-process
transformers policy (the turns of concurrent rollouts → one ``generate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Waiting(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    since: float
    caller: int | None = None  # which submit() call: a batch takes the callers' items in turn


@dataclass
class _Queue(Generic[T, R]):
    """One event loop's side of a batcher: its waiting items, its worker, and the batch that worker runs."""

    wake: asyncio.Event
    waiting: list[_Waiting[T, R]] = field(default_factory=list)
    taken: list[_Waiting[T, R]] = field(default_factory=list)
    now: list[_Waiting[T, R]] = field(default_factory=list)  # the items of ``run_now`` calls, running
    worker: asyncio.Task[None] | None = None


class MicroBatcher(Generic[T, R]):
    """Runs the items submitted concurrently on one event loop through ``run_batch``, in batches.

    A batch starts as soon as ``size`` items wait, or ``max_wait_s`` after its oldest item arrived, and holds
    at most ``size`` items, taken from the waiting callers in turn (a caller that submitted many items shares
    the batch with the others, not ahead of them); batches run one at a time. The worker sleeps on an event
    that a new item or a new ``size`` sets, never in a poll loop. An item whose caller went away (its future
    cancelled) is dropped. Each event loop that submits (a policy outlives its runs' loops, and two threads may
    run one each) has its own queue and worker: items of different loops never share a batch.
    With ``retry_alone``, a batch that fails is run again one item at a time, so only an item that fails alone
    sees an error; otherwise every item of the failed batch gets the exception. A caller whose item failed gets
    that error, and its other items are dropped.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        size: int,
        max_wait_s: float,
        retry_alone: bool = False,
    ) -> None:
        self.run_batch = run_batch
        self.max_wait_s = max_wait_s
        self.retry_alone = retry_alone
        self._size = max(1, size)
        self._queues: dict[asyncio.AbstractEventLoop, _Queue[T, R]] = {}
        self._lock = threading.Lock()  # loops on other threads add and drop queues
        self._callers = itertools.count()

    @property
    def size(self) -> int:
        """How many waiting items start a batch at once, and the most one holds."""
        return self._size

    @size.setter
    def size(self, size: int) -> None:
        self._size = max(1, size)
        with self._lock:
            queues = list(self._queues.items())
        for loop, queue in queues:  # the items waiting now may be a full batch
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile
                loop.call_soon_threadsafe(queue.wake.set)

    def _queue(self, loop: asyncio.AbstractEventLoop) -> _Queue[T, R]:
        """``loop``'s queue, made on its first submit; the queues of closed loops are let go."""
        with self._lock:
            self._queues = {other: q for other, q in self._queues.items() if not other.is_closed()}
            return self._queues.setdefault(loop, _Queue(asyncio.Event()))

    async def submit(self, items: Sequence[T]) -> list[R]:
        """The results of ``items``, in order, each run in the batch it joins."""
        loop = asyncio.get_running_loop()
        queue = self._queue(loop)
        if queue.worker is None or queue.worker.done():
            queue.worker = loop.create_task(self._work(queue))
        caller = next(self._callers)
        waiting = [_Waiting(item, loop.create_future(), loop.time(), caller) for item in items]
        queue.waiting += waiting
        queue.wake.set()
        try:
            return list(await asyncio.gather(*(w.future for w in waiting)))
        except BaseException:
            for w in waiting:  # the caller has its answer, an error: its other items are run for no one
                w.future.cancel()
            raise

    async def run_now(self, items: Sequence[T]) -> list[R]:
        """The results of ``items`` run as one batch of their own, now (no gathering with other callers)."""
        loop = asyncio.get_running_loop()
        caller = next(self._callers)  # one caller: an item that fails fails the others, not searched alone for no one
        waiting = [_Waiting(item, loop.create_future(), loop.time(), caller) for item in items]
        queue = self._queue(loop)
        queue.now += waiting
        try:
            await self._run(queue, waiting)
        finally:
            queue.now = [w for w in queue.now if w.caller != caller]
        return list(await asyncio.gather(*(w.future for w in waiting)))

    @staticmethod
    def _live(queue: _Queue[T, R]) -> list[_Waiting[T, R]]:
        queue.waiting = [w for w in queue.waiting if not w.future.done()]
        return queue.waiting

    async def _work(self, queue: _Queue[T, R]) -> None:
        loop = asyncio.get_running_loop()
        while self._live(queue):
            deadline = queue.waiting[0].since + self.max_wait_s
            while 0 < len(self._live(queue)) < self._size and loop.time() < deadline:
                queue.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queue.wake.wait(), deadline - loop.time())
            batch = queue.taken = self._take(queue)
            try:
                if batch:
                    await self._run(queue, batch)
            finally:  # the worker cancelled mid-batch (the loop shutting down): no caller is left waiting
                for waiting in batch:
                    waiting.future.cancel()

    def _take(self, queue: _Queue[T, R]) -> list[_Waiting[T, R]]:
        """The next batch: the waiting callers' items in turn (one each, in order of arrival), up to ``size``."""
        if len(queue.waiting) <= self._size:
            batch, queue.waiting = queue.waiting, []  # everything waiting fits
            return batch
        by_caller: dict[int, list[_Waiting[T, R]]] = {}
        for waiting in queue.waiting:
            by_caller.setdefault(waiting.caller, []).append(waiting)
        callers = [iter(items) for items in by_caller.values()]
        batch = []
        while callers and len(batch) < self._size:
            for items in list(callers):
                taken = next(items, None)
                if taken is None:
                    callers.remove(items)
                elif len(batch) < self._size:
                    batch.append(taken)
        chosen = {id(w) for w in batch}
        queue.waiting = [w for w in queue.waiting if id(w) not in chosen]
        return batch

    async def _run(self, queue: _Queue[T, R], batch: list[_Waiting[T, R]]) -> None:
        try:
            try:
                results = await self.run_batch([w.item for w in batch])
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this task is being cancelled
                # the batch function's own call was cancelled (a backend cancelling its request): its failure
                raise RuntimeError("the batch's call was cancelled by the backend") from exc
            if len(results) != len(batch):
                raise ValueError(f"a batch of {len(batch)} items gave {len(results)} results")
        except Exception as exc:
            if self.retry_alone and len(batch) > 1:
                logger.warning("a batch of %d failed (%r): running its items one at a time", len(batch), exc)
                for waiting in batch:
                    if not waiting.future.done():
                        await self._run(queue, [waiting])
                return
            for waiting in batch:
                self._fail(queue, waiting, exc)
            return
        for waiting, result in zip(batch, results, strict=True):
            if not waiting.future.done():  # a caller that went away has cancelled its future
                waiting.future.set_result(result)

    @staticmethod
    def _fail(queue: _Queue[T, R], waiting: _Waiting[T, R], exc: Exception) -> None:
        """``waiting``'s item failed, and with it its caller's request: the caller's other items, queued or in the
        batch being retried, are dropped (run, they would answer no one, and keep every other caller waiting)."""
        if not waiting.future.done():
            waiting.future.set_exception(exc)
        if waiting.caller is not None:
            for other in (*queue.waiting, *queue.taken, *queue.now):
                if other.caller == waiting.caller:
                    other.future.cancel()

    async def close(self) -> None:
        """Wait until the items waiting now on this event loop have run."""
        queue = self._queues.get(asyncio.get_running_loop())
        if queue is not None and queue.worker is not None and not queue.worker.done():
            await queue.worker
