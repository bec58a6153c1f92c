"""run_sync and the sync agent API: one shared event loop, so loop-bound clients live across calls."""

import asyncio
import contextvars
import os

import pytest
from langchain_openai import ChatOpenAI
from typer.testing import CliRunner

from ps_agent import ParallelSearchAgent
from ps_agent.cli import app
from ps_agent.runner import run_sync, shared_loop
from ps_agent.testing import OpenAIChatDouble, SleepyRetriever
from tests.test_retrieval_server import corpus, retrieval_server  # noqa: F401 (corpus is a fixture)

who = contextvars.ContextVar("who", default="nobody")


async def current_loop_and_caller() -> tuple[asyncio.AbstractEventLoop, str]:
    return asyncio.get_running_loop(), who.get()


def test_sync_calls_share_one_loop_and_carry_the_callers_context():
    who.set("caller")
    first, caller = run_sync(current_loop_and_caller())
    second, _ = run_sync(current_loop_and_caller())
    assert first is second is shared_loop()
    assert caller == "caller"


def test_run_sync_inside_a_running_loop_and_on_the_shared_loop_itself():
    async def from_jupyter():  # a running loop in this thread, as in a notebook cell
        return run_sync(current_loop_and_caller())[0]

    assert asyncio.run(from_jupyter()) is shared_loop()

    async def nested():  # a sync API used by a coroutine that already runs on the shared loop
        return run_sync(asyncio.sleep(0, result="no deadlock"))

    assert run_sync(nested()) == "no deadlock"


@pytest.mark.timeout(60)  # a deadlock check: before the fix this waited for ever
def test_a_sync_call_nested_twice_on_the_shared_loop_neither_deadlocks_nor_loses_the_callers_context():
    async def reads_caller() -> str:
        return who.get()

    async def middle() -> str:  # runs apart from the shared loop, which the call below blocks
        return run_sync(reads_caller())  # sent to the blocked shared loop, it never ran

    async def outer() -> str:
        who.set("outer caller")
        return run_sync(middle())  # the context did not go with it to its loop apart

    assert run_sync(outer()) == "outer caller"


def token_cap(body: dict) -> int | None:
    return body.get("max_completion_tokens", body.get("max_tokens"))  # OpenAI's current name, or the older one


@pytest.mark.parametrize("protocol", ["tools", "tags"])
def test_sync_invoke_with_an_openai_chat_model_runs_many_turns_and_questions(protocol):
    with OpenAIChatDouble(answer="Paris") as server:
        model = ChatOpenAI(base_url=server.base_url, api_key="double", model="double", max_retries=0)
        agent = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol=protocol, max_new_tokens=64)
        results = [agent.invoke({"question": f"Capitals of France and Italy? ({i})"}) for i in range(3)]
    assert [r["answer"] for r in results] == ["Paris"] * 3
    assert all(r["stats"]["llm_calls"] == 2 and r["stats"]["sub_queries"] == 2 for r in results)
    assert [token_cap(body) for body in server.requests] == [64] * 6  # the agent's cap reaches the server


def test_ask_with_a_provider_spec_answers(monkeypatch, corpus):  # noqa: F811
    with OpenAIChatDouble(answer="Paris") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "double")
        args = ["ask", "Capitals of France and Italy?", "--llm", "openai:double", "--corpus", str(corpus)]
        result = CliRunner().invoke(app, [*args, "--max-new-tokens", "32"])
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output and "search round 1" in result.output
    assert {token_cap(body) for body in server.requests} == {32}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_sync_invokes_with_the_http_retriever_keep_open_files_flat(corpus, tmp_path):  # noqa: F811
    with retrieval_server(corpus, tmp_path) as url, OpenAIChatDouble() as server:
        model = ChatOpenAI(base_url=server.base_url, api_key="double", model="double", max_retries=0)
        agent = ParallelSearchAgent(llm=model, retriever=f"{url}/retrieve", protocol="tools")
        counts = []
        for i in range(25):
            assert agent.invoke({"question": f"Eiffel Tower or Colosseum? ({i})"})["answer"] == "Paris"
            counts.append(open_fds())
    assert counts[-1] - counts[4] <= 2, counts  # was ~3 more per question: one client per per-node loop
