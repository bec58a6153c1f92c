"""Test doubles, named as such: scripted policies, retrievers with controllable latency and faults, and
OpenAI-compatible servers on 127.0.0.1 that misbehave on purpose; and ``batched``, for tests of a real loaded
policy. For unit tests and benchmarks of code built on this package (like LangChain's
``langchain_core.language_models.fake``); never used by the agent itself."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from ps_agent.retrieval import Passage


def scripted_llm(*turns: str) -> FakeListLLM:
    """Test double: a LangChain LLM that replies with ``turns`` in order."""
    return FakeListLLM(responses=list(turns))


@contextlib.contextmanager
def batched(policy: Any, runs: int) -> Iterator[Any]:
    """A loaded policy (``resolve_text_policy``'s, shared by the tests of a process) whose turns wait for the
    turns of ``runs`` concurrent runs and are generated as one batch, for the ``with`` block only."""
    expected, policy.expected = policy.expected, runs
    try:
        yield policy
    finally:
        policy.expected = expected


class SleepyRetriever:
    """Test double: answers every query after ``delay_s``, recording each call's queries."""

    def __init__(self, delay_s: float = 0.0, fail_times: int = 0, error: Exception | None = None) -> None:
        self.delay_s = delay_s
        self.fail_times = fail_times
        self.error = error or ConnectionError("backend down")
        self.calls: list[list[str]] = []

    async def asearch(self, queries, k):
        self.calls.append(list(queries))
        await asyncio.sleep(self.delay_s)
        if self.fail_times > 0:
            self.fail_times -= 1
            raise self.error
        return [
            [Passage(f"{q}#{i}", f"Title of {q}", f"Passage {i} about {q}.", 1.0 / (i + 1)) for i in range(k)]
            for q in queries
        ]


class InFlightRetriever(SleepyRetriever):
    """Test double: counts the searches in flight. Each waits (up to 2 s) until ``expect`` have been in flight
    at once, so a round that runs in parallel reaches ``peak == expect`` on a loaded machine too, and one that
    does not stays below it."""

    def __init__(self, expect: int) -> None:
        super().__init__()
        self.expect, self.in_flight, self.peak = expect, 0, 0

    async def asearch(self, queries, k):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            for _ in range(400):
                if self.peak >= self.expect:
                    break
                await asyncio.sleep(0.005)
            return await super().asearch(queries, k)
        finally:
            self.in_flight -= 1


class ToolCallingFakeChatModel(GenericFakeChatModel):
    """Test double: a chat model replying with scripted messages (tool calls included); tools bind as no-ops."""

    bound_tools: list = []  # noqa: RUF012 (a pydantic field: copied per instance)

    def bind_tools(self, tools, **kwargs):
        self.bound_tools = list(tools)
        return self


def tool_calls(*queries: str) -> AIMessage:
    """Test double helper: one AI message calling `search` once per query, in parallel."""
    return AIMessage(
        content="",
        tool_calls=[
            {"name": "search", "args": {"query": q}, "id": f"call_{i}", "type": "tool_call"}
            for i, q in enumerate(queries)
        ],
    )


def send_json(handler: http.server.BaseHTTPRequestHandler, payload: dict) -> None:
    """Answer a test double's request with ``payload`` as a 200 JSON response."""
    body = json.dumps(payload).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _ServedDouble:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 serving ``handler`` while used as a context manager."""

    def _serve(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingServerDouble(_ServedDouble):
    """Test double: an internal URL a client might make the server call. Every request's path is kept in ``hits``,
    and each is answered with a 500 error page. Use as a context manager; ``url`` is its root."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"internal admin page")

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.hits = hits
        self._serve(Handler)
        self.url = self.base_url.removesuffix("/v1")


class OpenAIChatDouble(_ServedDouble):
    """Test double: an OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1 (a thread).

    It plays a two-turn agent: a search first (two parallel tool calls, or ``<search>a ## b</search>`` in
    the tags protocol), then an answer once the conversation holds its own earlier turn. Every request body is
    kept in ``requests``. Use as a context manager; ``base_url`` is the ``.../v1`` to give a client.
    """

    def __init__(self, answer: str = "Paris") -> None:
        self.answer = answer
        self.requests: list[dict] = []
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK wait

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                double.requests.append(body)
                send_json(self, double.reply(body))

            def log_message(self, *args) -> None:
                pass

        self._serve(Handler)

    def reply(self, body: dict) -> dict:
        messages = body["messages"]
        observed = any(m["role"] in ("assistant", "tool") for m in messages)  # it has searched already
        message: dict = {"role": "assistant", "content": None}
        if observed:
            message["content"] = f"<answer>{self.answer}</answer>" if "tools" not in body else self.answer
        elif "tools" in body:
            calls = [{"name": "search", "arguments": json.dumps({"query": q})} for q in ("capital of France", "Rome")]
            message["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": f} for i, f in enumerate(calls)]
        else:
            message["content"] = "<search>capital of France ## capital of Italy</search>"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}
        return {"id": "double", "object": "chat.completion", "created": 0, "model": body["model"]} | {
            "choices": [choice],
            "usage": usage,
        }


class DroppingCompletionsDouble(_ServedDouble):
    """Test double: a ``/v1/completions`` server that closes the first ``drops`` connections without an answer
    (as a server closing an idle keep-alive connection the client then reuses), then answers. Counts every
    request in ``requests``. Use as a context manager."""

    def __init__(self, drops: int) -> None:
        self.drops, self.requests = drops, 0
        double = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                double.requests += 1
                if double.requests <= double.drops:
                    self.close_connection = True
                    self.connection.shutdown(2)  # no status line: the client reads a closed connection
                    return
                choice = {"text": "<answer>Paris</answer>", "token_ids": [1, 2]}
                send_json(self, {"choices": [choice | {"logprobs": {"token_logprobs": [-0.1, -0.2]}}]})

            def log_message(self, *args) -> None:
                pass

        self._serve(Handler)
