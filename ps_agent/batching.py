"""One micro-batcher: items submitted concurrently on an event loop are run together, in batches.

Used by the retrieval server (the queries of concurrent requests → one search) and the in-process
transformers policy (the turns of concurrent rollouts → one ``generate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
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


class MicroBatcher(Generic[T, R]):
    """Runs the items submitted concurrently on one event loop through ``run_batch``, in batches.

    A batch starts as soon as ``size`` items wait, or ``max_wait_s`` after its oldest item arrived, and holds
    at most ``size`` items, taken from the waiting callers in turn (a caller that submitted many items shares
    the batch with the others, not ahead of them); batches run one at a time. The worker sleeps on an event
    that a new item or a new ``size`` sets, never in a poll loop. An item whose caller went away (its future
    cancelled) is dropped.
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
        self._waiting: list[_Waiting[T, R]] = []
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._callers = itertools.count()
        self._taken: list[_Waiting[T, R]] = []  # the batch the worker runs now

    @property
    def size(self) -> int:
        """How many waiting items start a batch at once, and the most one holds."""
        return self._size

    @size.setter
    def size(self, size: int) -> None:
        self._size = max(1, size)
        self._wake.set()  # the items waiting now may be a full batch

    async def submit(self, items: Sequence[T]) -> list[R]:
        """The results of ``items``, in order, each run in the batch it joins."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            # a new loop (a policy outlives the loops of its runs): its own event, no items of a loop gone
            self._waiting = [w for w in self._waiting if w.future.get_loop() is loop]
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._work())
        caller = next(self._callers)
        waiting = [_Waiting(item, loop.create_future(), loop.time(), caller) for item in items]
        self._waiting += waiting
        self._wake.set()
        try:
            return list(await asyncio.gather(*(w.future for w in waiting)))
        except BaseException:
            for w in waiting:  # the caller has its answer, an error: its other items are run for no one
                w.future.cancel()
            raise

    async def run_now(self, items: Sequence[T]) -> list[R]:
        """The results of ``items`` run as one batch of their own, now (no gathering with other callers)."""
        loop = asyncio.get_running_loop()
        waiting = [_Waiting(item, loop.create_future(), loop.time()) for item in items]
        await self._run(waiting)
        return list(await asyncio.gather(*(w.future for w in waiting)))

    def _live(self) -> list[_Waiting[T, R]]:
        self._waiting = [w for w in self._waiting if not w.future.done()]
        return self._waiting

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while self._live():
            deadline = self._waiting[0].since + self.max_wait_s
            while 0 < len(self._live()) < self._size and loop.time() < deadline:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), deadline - loop.time())
            batch = self._taken = self._take()
            try:
                if batch:
                    await self._run(batch)
            finally:  # the worker cancelled mid-batch (the loop shutting down): no caller is left waiting
                for waiting in batch:
                    waiting.future.cancel()

    def _take(self) -> list[_Waiting[T, R]]:
        """The next batch: the waiting callers' items in turn (one each, in order of arrival), up to ``size``."""
        if len(self._waiting) <= self._size:
            batch, self._waiting = self._waiting, []  # everything waiting fits
            return batch
        by_caller: dict[int, list[_Waiting[T, R]]] = {}
        for waiting in self._waiting:
            by_caller.setdefault(waiting.caller, []).append(waiting)
        queues = [iter(items) for items in by_caller.values()]
        batch = []
        while queues and len(batch) < self._size:
            for queue in list(queues):
                taken = next(queue, None)
                if taken is None:
                    queues.remove(queue)
                elif len(batch) < self._size:
                    batch.append(taken)
        chosen = {id(w) for w in batch}
        self._waiting = [w for w in self._waiting if id(w) not in chosen]
        return batch

    async def _run(self, batch: list[_Waiting[T, R]]) -> None:
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
                        await self._run([waiting])
                return
            for waiting in batch:
                self._fail(waiting, exc)
            return
        for waiting, result in zip(batch, results, strict=True):
            if not waiting.future.done():  # a caller that went away has cancelled its future
                waiting.future.set_result(result)

    def _fail(self, waiting: _Waiting[T, R], exc: Exception) -> None:
        """``waiting``'s item failed, and with it its caller's request: the caller's other items, queued or in the
        batch being retried, are dropped (run, they would answer no one, and keep every other caller waiting)."""
        if not waiting.future.done():
            waiting.future.set_exception(exc)
        if waiting.caller is not None:
            for other in (*self._waiting, *self._taken):
                if other.caller == waiting.caller:
                    other.future.cancel()

    async def close(self) -> None:
        """Wait until the items waiting now have run."""
        if self._worker is not None and not self._worker.done():
            await self._worker
