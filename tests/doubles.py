"""Test doubles (named as such): scripted policies and retrievers with controllable latency and faults."""

from __future__ import annotations

import asyncio

from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from ps_agent.retrieval import Passage


def scripted_llm(*turns: str) -> FakeListLLM:
    """Test double: a LangChain LLM that replies with ``turns`` in order."""
    return FakeListLLM(responses=list(turns))


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
