"""What a client of a served graph may choose (issue 27): names the operator offers, settings within bounds, and
a run that ends within its time budget. The graph runs through its real LangGraph machinery; the URLs a client
names are real HTTP servers on 127.0.0.1 that count what reaches them."""

import asyncio
from collections.abc import Iterator
from dataclasses import fields

import pytest

from ps_agent import AgentError, ParallelSearchAgent
from ps_agent.configuration import AgentConfig
from ps_agent.llms import EMBEDDED_SPECS
from ps_agent.retrieval import resilient_search
from ps_agent.serving import ChoiceError, Choices, served_context, served_graph
from ps_agent.testing import RecordingServerDouble, SleepyRetriever, scripted_llm

ANSWER = "<think>done</think>\n<answer> Paris </answer>"


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server on 127.0.0.1 that records every request path: a URL a client might make us call."""
    with RecordingServerDouble() as server:
        yield server.url, server.hits


def test_the_environment_names_what_is_offered():
    offered = Choices.from_env({"PS_AGENT_ALLOWED_LLMS": "smollm2, fast = vllm:http://gpu:8000/v1"})
    assert dict(offered.llms) == {"smollm2": "smollm2", "fast": "vllm:http://gpu:8000/v1"}
    assert offered.pick("llm", None) == "smollm2" and offered.pick("llm", "fast") == "vllm:http://gpu:8000/v1"
    assert dict(Choices.from_env({}).llms) == {name: name for name in EMBEDDED_SPECS}
    with pytest.raises(ValueError, match=r"'gpt' is not an embedded llm .* name it as NAME=SPEC"):
        Choices.from_env({"PS_AGENT_ALLOWED_LLMS": "gpt"})
    with pytest.raises(ValueError, match="PS_AGENT_ALLOWED_CORPORA: bad entry 'wiki=': expected NAME or NAME=SPEC"):
        Choices.from_env({"PS_AGENT_ALLOWED_CORPORA": "wiki="})
    with pytest.raises(ValueError, match="PS_AGENT_ALLOWED_CORPORA is set but names nothing"):
        Choices.from_env({"PS_AGENT_ALLOWED_CORPORA": " , "})


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("corpus", "/etc/passwd"),
        ("corpus", "{url}/admin?x="),
        ("llm", "vllm:{url}/v1"),
        ("llm", "openai:gpt-4o"),
        ("llm", "hf:/etc"),
        ("corpus", ["embedded"]),
    ],
)
def test_a_served_graph_refuses_what_the_operator_did_not_offer(kind, value, listener):
    url, seen = listener
    value = value.format(url=url) if isinstance(value, str) else value
    graph = served_graph(Choices(corpora={"wiki": SleepyRetriever()}, llms={"scripted": scripted_llm(ANSWER)}))
    with pytest.raises(ChoiceError, match=f"{kind} .* is not offered here: choose one of (wiki|scripted)$") as error:
        graph.invoke({"question": "Q?"}, context={kind: value})
    assert seen == [], "the server contacted a URL a client named"
    assert "passwd" not in str(error.value) or value == "/etc/passwd"  # no file content, no path-exists answer


def test_a_served_graph_runs_on_the_names_it_offers():
    retriever = SleepyRetriever()
    graph = served_graph(Choices(corpora={"wiki": retriever}, llms={"scripted": scripted_llm(ANSWER)}))
    out = graph.invoke({"question": "Q?"}, context={"llm": "scripted", "corpus": "wiki", "max_turns": 2})
    assert out["answer"] == "Paris"
    schema = graph.get_context_jsonschema()["properties"]  # what Studio shows: the names as choices
    assert [option.get("const") or option.get("enum") for option in schema["corpus"]["anyOf"]] == ["wiki", None]


def test_a_served_context_refuses_unbounded_settings():
    served = served_context(Choices())
    with pytest.raises(ValueError, match="search_retries must be an integer from 0 to 10, got '3'"):
        served(search_retries="3")
    with pytest.raises(ValueError, match="max_turns must be an integer from 1 to 32, got 1000000"):
        served(max_turns=10**6)


def test_per_request_configurable_picks_by_name_only(listener):
    url, seen = listener
    chosen = SleepyRetriever()
    agent = ParallelSearchAgent(
        llm=scripted_llm(ANSWER),
        retriever=SleepyRetriever(),
        choices=Choices(llms={"a": "a"}, corpora={"wiki": chosen}),
    )
    for bad in (
        {"corpus": f"{url}/retrieve"},
        {"corpus": "/etc/passwd"},
        {"llm": f"vllm:{url}/v1"},
        {"llm": ""},
        {"llm": 0},
        {"corpus": False},  # these three ran on the agent's own
    ):
        with pytest.raises(ChoiceError, match="is not offered here"):
            agent.invoke({"question": "Q?"}, config={"configurable": bad})
    assert seen == []
    searching = ParallelSearchAgent(
        llm=scripted_llm("<search> a </search>", ANSWER), choices=Choices(corpora={"wiki": chosen})
    )
    out = searching.invoke({"question": "Q?"}, config={"configurable": {"corpus": "wiki", "topk": 1}})
    assert out["answer"] == "Paris" and chosen.calls == [["a"]]


def test_the_search_timeout_covers_the_rate_limiters_wait():
    retriever = SleepyRetriever()

    async def burst():  # one search per second allowed: the second and third wait ~1 s and ~2 s for their turn
        searches = (resilient_search(retriever, f"q{i}", 1, rate_limit=1, timeout_s=0.3, retries=0) for i in range(3))
        return await asyncio.gather(*searches)

    outcomes = asyncio.run(burst())
    assert [o.error for o in outcomes] == [None, "timed out after 0.3 s", "timed out after 0.3 s"]


def test_a_run_ends_within_its_time_budget():
    slow = SleepyRetriever(delay_s=30)  # longer than the budget, shorter than the search timeout and retries
    agent = ParallelSearchAgent(
        llm=scripted_llm("<search> a </search>", ANSWER), retriever=slow, run_timeout_s=3, search_timeout_s=60
    )
    with pytest.raises(AgentError, match="LLM call failed on turn 2: TimeoutError: run_timeout_s=3 reached") as e:
        agent.invoke({"question": "Q?"})
    (search_round,) = e.value.trajectory["search_rounds"]
    assert search_round["results"][0]["error"].endswith("s (the end of the run's time budget, run_timeout_s)")


def test_an_offered_name_that_fails_to_resolve_names_the_choice_not_the_spec():
    """Review of issue 27: the error after a pick showed the operator's spec (a private path or host)."""
    graph = served_graph(Choices(llms={"local": "hf:/srv/private/model"}, corpora={"wiki": SleepyRetriever()}))
    with pytest.raises(ChoiceError, match=r"^llm 'local' cannot be used with these settings now") as error:
        graph.invoke({"question": "Q?"}, context={"llm": "local", "corpus": "wiki"})
    assert "/srv/private" not in str(error.value)


def test_the_tools_protocol_on_a_text_model_says_so_to_the_client():
    """A client choosing protocol 'tools' on an embedded or ``hf:`` model heard only "cannot be used with these
    settings now (the server's log says why)"; the reason is its own choice, and it is told which to change."""
    served = served_context(Choices(llms={"qwen0.5b": "qwen0.5b", "local": "hf:/srv/private/model"}))
    for name in (None, "local"):
        with pytest.raises(ChoiceError, match="protocol 'tools' needs a chat model with tool calling") as error:
            served(llm=name, protocol="tools")
        assert "use protocol 'tags' or another llm" in str(error.value) and "/srv" not in str(error.value)
    served(llm="local", protocol="tags")  # the tags protocol is what a text model speaks


def test_a_served_run_names_the_choice_that_failed_not_the_host_behind_it():
    """The model server's or the retrieval server's error reached the client with its private URL in it."""
    with RecordingServerDouble() as private:
        answer = "<think> read </think>\n<answer> Paris </answer>"
        choices = Choices(
            llms={"fast": f"vllm:{private.url}/v1", "scripted": scripted_llm("<search> Paris </search>", answer)},
            corpora={"remote": f"{private.url}/retrieve"},
        )
        graph = served_graph(choices)
        with pytest.raises(AgentError, match=r"llm 'fast' failed \(the server's log says why\)") as error:
            graph.invoke({"question": "Q?"}, context={"llm": "fast", "corpus": "remote"})
        assert private.url not in str(error.value) and "127.0.0.1" not in str(error.value)
        settings = {"llm": "scripted", "corpus": "remote", "search_retries": 0}
        out = graph.invoke({"question": "Q?"}, context=settings)
        (result,) = out["trajectory"]["search_rounds"][0]["results"]
        assert result["error"] == "corpus 'remote' failed (the server's log says why)"
        assert "127.0.0.1" not in str(out)
        assert len(private.hits) >= 2  # both servers were called and failed


def test_retries_stop_when_the_run_cannot_hold_another_attempt_and_keep_the_real_error():
    failing = SleepyRetriever(fail_times=9, error=RuntimeError("boom"))
    deadline = __import__("time").time() + 0.5
    outcome = asyncio.run(resilient_search(failing, "q", 1, retries=5, backoff_s=3, deadline=deadline))
    assert (outcome.error, outcome.attempts) == ("RuntimeError: boom", 1)  # no 3 s backoff past the budget


def test_choices_that_are_not_a_mapping_are_refused_where_they_are_given():
    """A list of names failed at a client's first pick with AttributeError, and a dict as choices= too."""
    with pytest.raises(ValueError, match=r"Choices.llms must be a mapping of name to spec, e.g. .*got list"):
        Choices(llms=["qwen0.5b"])
    with pytest.raises(ValueError, match=r"Choices.corpora must be a mapping .*got str"):
        Choices(corpora="embedded")
    with pytest.raises(TypeError, match=r"choices must be a ps_agent\.serving\.Choices, got dict"):
        ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever(), choices={"llms": {"a": "a"}})


def test_choices_are_imported_from_the_package_as_the_docs_write_them():
    """docs/agent.md and docs/serving.md write ``choices=Choices(...)``: ``ps_agent.Choices`` did not exist."""
    import ps_agent

    assert ps_agent.Choices is Choices and ps_agent.ChoiceError is ChoiceError


@pytest.mark.parametrize(
    ("permissions", "user", "refused"),
    [
        ([], {"identity": "anonymous"}, True),
        (["ps_agent:steer"], {"identity": "ops"}, False),
        ([], {"identity": "studio", "kind": "StudioUser"}, False),
    ],
)
def test_only_a_client_granted_steering_sends_commands_and_edits_state(permissions, user, refused):
    from langgraph_sdk import Auth

    from ps_agent.server_auth import (
        refuse_state_edits,
        refuse_unchecked_crons,
        refuse_unchecked_runs,
    )

    def decide(handler, action: str, value: dict) -> bool:
        ctx = Auth.types.AuthContext(permissions=permissions, user=user, resource="threads", action=action)
        try:
            asyncio.run(handler(ctx, value))
        except Auth.exceptions.HTTPException as error:
            assert error.status_code == 403 and '{"question": "..."}' in error.detail, error.detail
            return True
        return False

    assert decide(refuse_unchecked_runs, "create_run", {"kwargs": {"command": {"goto": "search"}}}) is refused
    assert decide(refuse_unchecked_runs, "create_run", {"kwargs": {"input": None}}) is refused
    assert decide(refuse_state_edits, "update", {"thread_id": "t"}) is refused
    assert decide(refuse_unchecked_crons, "create", {"payload": {"schedule": "0 0 1 1 *"}}) is refused
    assert not decide(refuse_unchecked_runs, "create_run", {"kwargs": {"input": {"question": "Q?"}}})
    assert not decide(refuse_state_edits, "update", {"thread_id": "t", "action": "interrupt"})  # cancelling a run


@pytest.mark.parametrize("steering", [False, True])
def test_a_run_whose_input_or_context_the_graph_would_not_take_as_sent_is_refused_saying_what(steering):
    """The server drops a context key its schema lacks and the graph reads only an input's question: a misspelt
    ``max_turn`` or a ``max_turns`` put in the input ran on the defaults, and the client never learned. Refused
    (422) for every client, with what was wrong and what is expected; a ``configurable`` may carry other keys."""
    from langgraph_sdk import Auth

    from ps_agent.server_auth import refuse_unchecked_crons, refuse_unchecked_runs

    user = {"identity": "studio", "kind": "StudioUser"} if steering else {"identity": "anonymous"}
    ctx = Auth.types.AuthContext(permissions=[], user=user, resource="threads", action="create_run")

    def refusal(handler, value: dict) -> str | None:
        try:
            asyncio.run(handler(ctx, value))
        except Auth.exceptions.HTTPException as error:
            assert error.status_code == 422, error.detail
            return error.detail
        return None

    question = {"question": "Q?"}
    marked = {"configurable": {"__context_provided__": True}}  # what the server adds when a client sends a context
    typo = {"input": question, "context": {"max_turn": 1}, "config": marked}
    assert refusal(refuse_unchecked_runs, {"kwargs": typo}) == (
        f"a run: its context has an unknown setting 'max_turn' (did you mean 'max_turns'?): expected some of "
        f"{[f.name for f in fields(AgentConfig)]}"
    )
    assert "unknown setting 'top_k' (did you mean 'topk'?)" in refusal(
        refuse_unchecked_crons, {"payload": {"input": question, "context": {"top_k": 9}}}
    )
    assert refusal(refuse_unchecked_runs, {"kwargs": {"input": question | {"max_turns": 1}}}) == (
        "a run: its input is {\"question\": \"...\"} and nothing else; got the keys ['max_turns', 'question']"
    )
    assert refusal(refuse_unchecked_runs, {"kwargs": {"input": "Q?"}}).endswith("got a str")
    assert refusal(refuse_unchecked_runs, {"kwargs": {"input": {}}}).endswith("got the keys []")
    settings = {"input": question, "context": {"max_turns": 1, "llm": "qwen0.5b", "corpus": "wiki"}, "config": marked}
    assert refusal(refuse_unchecked_runs, {"kwargs": settings}) is None
    unmarked = {"input": question, "context": {"user_id": 7}, "config": {"configurable": {"user_id": 7}}}
    assert refusal(refuse_unchecked_runs, {"kwargs": unmarked}) is None  # a configurable's other keys stay open
