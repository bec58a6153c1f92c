"""Signals during training: Ctrl-C stops a rollout batch at once, and SIGTERM unwinds a run through its
``finally`` blocks (a rollout server is stopped, the trajectory log closed), as Ctrl-C would."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def signal_handled(signum: int, handler: Any) -> Iterator[None]:
    """Within the block, ``handler`` handles ``signum`` in the main thread (elsewhere nothing changes); the
    previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def signal_raises(signum: int, exception: Callable[[], BaseException]) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``signum`` raises ``exception()`` in the main thread (``signal_handled``). Where an event
    loop runs there, it is raised by the loop between two of its steps, never from inside what the step was doing:
    raised in the middle of ``Thread.start`` (an executor starting the policy's generation thread), it left a
    thread that no executor knew of, and the process could not exit. A second signal raises where it lands."""
    pending = False

    def raise_(signum: int, frame: Any) -> None:
        nonlocal pending
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop runs in the main thread
            loop = None
        if loop is None or pending:
            raise exception()
        pending = True
        loop.call_soon_threadsafe(_raise, exception)  # asyncio lets KeyboardInterrupt and SystemExit through

    return signal_handled(signum, raise_)


def _raise(exception: Callable[[], BaseException]) -> None:
    raise exception()


def ctrl_c_interrupts() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` at once while rollouts run. Under Python's own handler, ``asyncio.run``
    turns the first Ctrl-C into a cancellation of the batch, and a batch whose agents finish their runs anyway
    returned normally: training went on. A process that ignores SIGINT (one a non-interactive shell started in the
    background, as ``nohup ... &``) keeps ignoring it, as Python and asyncio do: stop such a run with SIGTERM."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return contextlib.nullcontext()
    return signal_raises(signal.SIGINT, KeyboardInterrupt)


def sigterm_unwinds() -> contextlib.AbstractContextManager[None]:
    """While training, SIGTERM raises ``SystemExit`` (as Ctrl-C raises ``KeyboardInterrupt``), so the rollout
    server is stopped on the way out; the previous handler comes back afterwards."""
    return signal_raises(signal.SIGTERM, lambda: SystemExit(128 + signal.SIGTERM))
