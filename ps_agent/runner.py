"""``run_sync``: run a coroutine from sync code on one long-lived event loop.

Every sync entry point (``agent.invoke``/``stream``, the CLI, eval, LangChain's sync retriever API) runs
its coroutines on the same loop, kept in a daemon thread. Clients that bind to the loop they were
first used on (a LangChain chat model's HTTP client, the retrieval client's connection pool) then live
across calls, instead of dying with a per-call ``asyncio.run`` ("Event loop is closed" on the second
turn, and a few leaked sockets per question).

``graph_node`` wraps the graph's async nodes so that the graph's own sync ``invoke`` runs them on that loop
too: the one place this project uses LangGraph's private ``RunnableCallable`` (the public ``RunnableLambda``
costs ~1 ms more per turn, measured), so a LangGraph upgrade that moves it breaks here and only here.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph._internal._runnable import RunnableCallable  # LangGraph's node wrapper: a sync and an async function

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from langgraph.runtime import Runtime

    from ps_agent.context import Context

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop that sync calls run on, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="ps-agent-event-loop", daemon=True).start()
        return _loop


def _forget_loop() -> None:  # a forked child has the loop object but not its thread
    global _loop
    _loop = None


os.register_at_fork(after_in_child=_forget_loop)


_apart = threading.local()  # set in a thread running a coroutine apart from the blocked shared loop


def _run_apart(coroutine: Coroutine[Any, Any, T]) -> T:
    _apart.active = True
    return asyncio.run(coroutine)


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the shared loop and wait for its result (also from Jupyter's running loop).

    The caller's context variables (LangChain callbacks and tracing) go with it; interrupting the
    wait (Ctrl-C) cancels the coroutine.
    """
    loop = shared_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    context = contextvars.copy_context()
    if running is loop or getattr(_apart, "active", False):
        # a sync API called from a coroutine on the shared loop: waiting for that loop would deadlock it, so the
        # coroutine runs on a loop of its own, and so does any sync call it makes in turn (the shared loop is
        # still blocked by this one)
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(context.run, _run_apart, coroutine).result()

    async def in_callers_context() -> T:
        return await asyncio.get_running_loop().create_task(coroutine, context=context)

    future = asyncio.run_coroutine_threadsafe(in_callers_context(), loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def graph_node(
    afunc: Callable[[Any, Runtime[Context]], Awaitable[dict[str, Any]]], defaults: Context
) -> RunnableCallable:
    """``afunc`` as a node that also runs under the graph's sync ``invoke``/``stream`` (on the shared loop,
    ``run_sync``), wrapped as LangGraph wraps a function node (its runtime injected, no trace run of its own:
    a ``RunnableLambda`` costs ~1 ms more per turn); a run given no context runs on ``defaults``, as Studio's
    runs with no settings do."""

    def given(runtime: Runtime[Context]) -> Runtime[Context]:
        return runtime if runtime.context is not None else runtime.override(context=defaults)

    async def acall(state: Any, runtime: Runtime[Context]) -> dict[str, Any]:
        return await afunc(state, given(runtime))

    def call(state: Any, runtime: Runtime[Context]) -> dict[str, Any]:
        return run_sync(afunc(state, given(runtime)))

    return RunnableCallable(call, acall, name=afunc.__name__, trace=False)
