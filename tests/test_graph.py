"""The graph through its real LangGraph machinery, with scripted policies and retrievers (test doubles)."""

import asyncio
import contextlib
import pickle
import re
import time

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.llms import LLM
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Send

from ps_agent import AgentError, ParallelSearchAgent
from ps_agent.context import Context
from ps_agent.graph import compile_graph, graph, prepare, route, think
from ps_agent.protocol import FORCED_ANSWER_PROMPT, INVALID_ACTION_MESSAGE
from ps_agent.retrieval import Passage
from ps_agent.rewards import RewardWeights, format_valid, search_count_component
from ps_agent.serving import Choices
from ps_agent.testing import InFlightRetriever, SleepyRetriever, scripted_llm

W = RewardWeights()
FOUR = "<think>four independent parts</think>\n<search> ant ## bee ## cat ## dog </search>"
ANIMALS = "Which lives longest: an ant, a bee, a cat or a dog?"  # a question FOUR splits
ANSWER = "<think>done</think>\n<answer> Paris </answer>"


@pytest.mark.parametrize("path", ["invoke", "ainvoke", "graph.invoke"])
def test_round_of_four_runs_in_parallel(path):
    retriever = InFlightRetriever(expect=4)
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=retriever)
    runs = {
        "invoke": lambda: agent.invoke({"question": ANIMALS}),
        "ainvoke": lambda: asyncio.run(agent.ainvoke({"question": ANIMALS})),
        "graph.invoke": lambda: agent.graph.invoke({"question": ANIMALS}),  # the graph's own sync path: node by node
    }
    out = runs[path]()
    assert retriever.peak == 4, f"{retriever.peak} of a round's 4 searches were in flight at once"
    assert out["answer"] == "Paris"
    assert sorted(call[0] for call in retriever.calls) == ["ant", "bee", "cat", "dog"]
    (record,) = out["trajectory"]["search_rounds"]
    assert [r["sub_query"] for r in record["results"]] == ["ant", "bee", "cat", "dog"]
    assert out["stats"] == out["stats"] | {"llm_calls": 2, "search_rounds": 1, "sub_queries": 4, "decomposed": True}


def test_nodes_run_alone_on_a_context():
    runtime = Runtime(context=Context(llm=scripted_llm(FOUR), corpus=SleepyRetriever()))
    state = asyncio.run(prepare({"question": "  Q?  "}, runtime))
    assert state["question"] == "Q?" and state["prompt_messages"][-1]["content"].endswith("Question: Q?\n")
    update = asyncio.run(think(state, runtime))
    (call,) = update["llm_calls"]
    assert call["turn"] == 1 and call["action"] == "search" and call["latency_s"] > 0
    assert update["pending"]["searched"] == ["ant", "bee", "cat", "dog"]
    assert [send.arg["sub_query"] for send in route(state | update)] == ["ant", "bee", "cat", "dog"]


def test_the_graph_takes_its_settings_model_and_retriever_from_the_context():
    retriever = SleepyRetriever()
    context = {"llm": scripted_llm(FOUR, ANSWER), "corpus": retriever, "mode": "sequential", "topk": 1}
    out = graph.invoke({"question": "Q?"}, context=context)
    assert out["trajectory"]["mode"] == "sequential" and retriever.calls == [["ant ## bee ## cat ## dog"]]
    assert len(out["trajectory"]["search_rounds"][0]["results"][0]["passages"]) == 1
    assert out["answer"] == "Paris"


class StampedRetriever(SleepyRetriever):
    """Test double: a native retriever that records when each search starts."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[float] = []

    async def asearch(self, queries, k):
        self.started.append(time.monotonic())
        return await super().asearch(queries, k)


class StampedLangChainRetriever(BaseRetriever):
    """Test double: a LangChain retriever that records when each search starts."""

    started: list[float] = []  # noqa: RUF012 (a pydantic field: copied per instance)

    def _get_relevant_documents(self, query, *, run_manager=None):
        self.started.append(time.monotonic())
        return [Document(page_content=f"Passage about {query}.", metadata={"title": query})]

    async def _aget_relevant_documents(self, query, *, run_manager=None):
        return self._get_relevant_documents(query)


@pytest.mark.parametrize("backend", [StampedRetriever, StampedLangChainRetriever], ids=["native", "langchain"])
def test_search_rate_limit_is_kept_per_backend_through_the_graph(backend):
    """Two agents on one backend at 4 searches per second, a round of 4 each: the second round waits a second
    (the i-th search starts at least i // 4 seconds after the first could)."""
    retriever = backend()
    agents = [ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=retriever, search_rate_limit=4)]
    agents.append(ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=retriever, search_rate_limit=4))
    began = time.monotonic()
    outs = [agent.invoke("Q?") for agent in agents]
    assert [out["stats"]["failed_searches"] for out in outs] == [0, 0]
    starts = sorted(retriever.started)
    assert len(starts) == 8
    waited = [round(start - began, 2) for start in starts]
    assert all(start - began >= i // 4 for i, start in enumerate(starts)), f"searches started after {waited} s"


def test_sequential_mode_searches_one_query_per_round():
    turns = [f"<search> {q} </search>" for q in "abcd"] + [ANSWER]
    retriever = SleepyRetriever()
    agent = ParallelSearchAgent(llm=scripted_llm(*turns), retriever=retriever, mode="sequential", max_turns=6)
    out = agent.invoke({"question": "Q?"})
    rounds = out["trajectory"]["search_rounds"]
    assert [r["searched"] for r in rounds] == [["a"], ["b"], ["c"], ["d"]]
    assert out["stats"]["decomposed"] is False and out["stats"]["llm_calls"] == 5
    assert "separated by ##" not in out["trajectory"]["prompt"]


def test_sequential_mode_searches_hashes_as_plain_text():
    retriever = SleepyRetriever()
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=retriever, mode="sequential")
    out = agent.invoke({"question": "Q?"})
    assert retriever.calls == [["ant ## bee ## cat ## dog"]]
    assert out["stats"]["sub_queries"] == 1


def test_observation_joins_results_in_sub_query_order():
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=SleepyRetriever(), topk=2)
    out = agent.invoke({"question": "Q?"})
    response = out["trajectory"]["response"]
    positions = [response.index(f"Query: {q}") for q in ("ant", "bee", "cat", "dog")]
    assert positions == sorted(positions)
    assert "Doc 2(Title: Title of dog) Passage 1 about dog." in response
    assert response.count("<information>") == 1


def test_identical_sub_queries_are_searched_once():
    retriever = SleepyRetriever()
    agent = ParallelSearchAgent(llm=scripted_llm("<search> x ## y ## x </search>", ANSWER), retriever=retriever)
    out = agent.invoke({"question": "Q?"})
    assert sorted(c[0] for c in retriever.calls) == ["x", "y"]
    (record,) = out["trajectory"]["search_rounds"]
    assert record["sub_queries"] == ["x", "y", "x"] and record["searched"] == ["x", "y"]


def test_too_many_sub_queries_are_capped_and_the_observation_says_so():
    queries = " ## ".join(f"q{i}" for i in range(6))
    retriever = SleepyRetriever()
    agent = ParallelSearchAgent(
        llm=scripted_llm(f"<search> {queries} </search>", ANSWER), retriever=retriever, max_parallel=3
    )
    out = agent.invoke({"question": "Q?"})
    assert len(retriever.calls) == 3
    assert out["trajectory"]["search_rounds"][0]["capped_from"] == 6
    assert "Only the first 3 of 6 sub-queries were searched" in out["trajectory"]["response"]


def test_the_cap_counts_distinct_sub_queries():
    """A repeated sub-query took a place under ``max_parallel``, and a distinct one past it went unsearched."""
    retriever = SleepyRetriever()
    llm = scripted_llm("<search> Einstein birth ## Einstein Birth ## Newton birth </search>", ANSWER)
    question = "Who was born first, Einstein or Newton?"
    out = ParallelSearchAgent(llm=llm, retriever=retriever, max_parallel=2).invoke({"question": question})
    (record,) = out["trajectory"]["search_rounds"]
    assert record["searched"] == ["Einstein birth", "Newton birth"] and record["capped_from"] is None
    assert "Only the first" not in out["trajectory"]["response"] and out["stats"]["decomposed"] is True


def test_invalid_actions_get_search_r1s_message_and_max_turns_forces_an_answer():
    agent = ParallelSearchAgent(
        llm=scripted_llm("no tags at all", "<search> unclosed", "<search></search>", " Rome </answer>"),
        retriever=SleepyRetriever(),
        max_turns=3,
    )
    out = agent.invoke({"question": "Q?"})
    calls = out["trajectory"]["llm_calls"]
    assert [c["action"] for c in calls] == ["invalid", "search", "invalid", "forced_answer"]
    assert calls[0]["error"] == "no <search> or <answer> tag"
    assert calls[2]["error"] == "empty <search>"
    assert out["answer"] == "Rome"
    assert out["stats"] | {"invalid_turns": 2, "forced_answer": True, "llm_calls": 4} == out["stats"]
    response = out["trajectory"]["response"]
    assert response.count(INVALID_ACTION_MESSAGE) == 2
    assert FORCED_ANSWER_PROMPT in response
    assert calls[3]["prompt"].endswith(FORCED_ANSWER_PROMPT)


def test_endless_searching_is_bounded_by_max_turns():
    llm = FakeListLLM(responses=["<search> again </search>"] * 3 + ["nothing"])
    out = ParallelSearchAgent(llm=llm, retriever=SleepyRetriever(), max_turns=3).invoke({"question": "Q?"})
    assert out["stats"]["llm_calls"] == 4 and out["stats"]["search_rounds"] == 3
    assert out["answer"] == "nothing" and out["stats"]["forced_answer"]


def test_failing_retriever_is_reported_and_the_run_goes_on():
    retriever = SleepyRetriever(fail_times=99, error=ConnectionError("index offline"))
    agent = ParallelSearchAgent(
        llm=scripted_llm(FOUR, ANSWER), retriever=retriever, search_retries=1, search_backoff_s=0
    )
    out = agent.invoke({"question": "Q?"})
    assert out["answer"] == "Paris"
    assert out["stats"]["failed_searches"] == 4
    assert "Search failed: ConnectionError: index offline" in out["trajectory"]["response"]
    assert all(r["attempts"] == 2 for r in out["trajectory"]["search_rounds"][0]["results"])


def test_flaky_retriever_is_retried():
    retriever = SleepyRetriever(fail_times=1)
    agent = ParallelSearchAgent(
        llm=scripted_llm("<search> a </search>", ANSWER), retriever=retriever, search_backoff_s=0
    )
    out = agent.invoke({"question": "Q?"})
    (result,) = out["trajectory"]["search_rounds"][0]["results"]
    assert result["error"] is None and result["attempts"] == 2 and len(result["passages"]) == 3


def test_slow_retriever_times_out():
    agent = ParallelSearchAgent(
        llm=scripted_llm("<search> a </search>", ANSWER),
        retriever=SleepyRetriever(delay_s=5),
        search_timeout_s=0.05,
        search_retries=0,
    )
    out = agent.invoke({"question": "Q?"})
    assert out["trajectory"]["search_rounds"][0]["results"][0]["error"] == "timed out after 0.05 s"
    assert out["answer"] == "Paris"


class BrokenLLM(FakeListLLM):
    """Test double: fails on its second call."""

    def _call(self, prompt, stop=None, run_manager=None, **kwargs):
        if self.i >= 1:
            raise ConnectionError("model server went away")
        return super()._call(prompt, stop, run_manager, **kwargs)

    async def _acall(self, prompt, stop=None, run_manager=None, **kwargs):
        return self._call(prompt, stop, None, **kwargs)


def test_llm_error_carries_the_partial_trajectory():
    agent = ParallelSearchAgent(llm=BrokenLLM(responses=[FOUR, ANSWER]), retriever=SleepyRetriever())
    with pytest.raises(AgentError, match=r"turn 2.*model server went away") as info:
        agent.invoke({"question": "Q?"})
    assert len(info.value.trajectory["llm_calls"]) == 1
    assert len(info.value.trajectory["search_rounds"]) == 1
    assert info.value.stats["sub_queries"] == 4


@pytest.mark.parametrize("question", ["", "   \n"])
def test_empty_question_is_a_value_error(question):
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever())
    with pytest.raises(ValueError, match="question is empty"):
        agent.invoke({"question": question})


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"question": 42}, ValueError, "question must be a string, got int: 42"),  # was "question is empty"
        ({"query": "Q?"}, ValueError, r"the input has no 'question' \(it holds \['query'\]\): expected \{'question'"),
        (42, TypeError, "expected a question string, {'question': str} or chat messages, got int"),  # LangGraph's
        ([AIMessage("hi")], ValueError, "the messages hold no human message"),
    ],
)
def test_input_of_the_wrong_shape_says_what_was_expected(given, error, message):
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever())
    with pytest.raises(error, match=message if error is ValueError else re.escape(message)):
        agent.invoke(given)


def test_a_chat_s_messages_ask_their_last_human_message():
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER, ANSWER), retriever=SleepyRetriever())
    out = agent.invoke([HumanMessage("Old question?"), AIMessage("Rome"), HumanMessage("Capital of France?")])
    assert out["trajectory"]["question"] == "Capital of France?"
    assert agent.invoke(HumanMessage("Capital of Italy?"))["trajectory"]["question"] == "Capital of Italy?"
    with pytest.raises(TypeError, match="batch takes a list of questions, got one str"):  # ran 'Q' and '?'
        agent.batch("Q?")


def test_a_configurable_of_none_keeps_the_agents_own_model_and_retriever():
    """A name of None picked the operator's default model and corpus in place of the agent's own."""
    own = SleepyRetriever()
    offered = SleepyRetriever()
    agent = ParallelSearchAgent(
        llm=scripted_llm("<search> Paris </search>", ANSWER), retriever=own, choices=Choices(corpora={"w": offered})
    )
    out = agent.invoke("Q?", config={"configurable": {"llm": None, "corpus": None}})
    assert out["answer"] == "Paris" and own.calls == [["Paris"]] and offered.calls == []
    assert agent.invoke("Q?", config={"configurable": None})["answer"] == "Paris"  # LangChain's "no settings"
    with pytest.raises(TypeError, match=r"config\['configurable'\] must be a mapping of settings, got list"):
        agent.invoke("Q?", config={"configurable": [1]})


def test_long_question_is_truncated_with_a_warning(caplog):
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever(), max_question_chars=50)
    out = agent.invoke({"question": "why " * 100})
    assert len(out["trajectory"]["question"]) == 50
    assert "truncated to max_question_chars=50" in caplog.text
    assert out["stats"]["question_truncated"] is True  # a served graph's client sees no log: its output says so
    assert agent.invoke({"question": "why " * 12})["stats"]["question_truncated"] is False  # 48 characters


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="mode must be"):
        ParallelSearchAgent(mode="fast")
    with pytest.raises(ValueError, match="max_turns must be an integer from 1 to 32, got 0"):
        ParallelSearchAgent(max_turns=0)
    with pytest.raises(TypeError, match="cannot use int as a retriever"):
        ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=42).invoke({"question": "Q?"})


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"topk": 1000}, "topk must be an integer from 1 to 50, got 1000"),
        ({"search_timeout_s": float("nan")}, "search_timeout_s must be a number of seconds from"),
        ({"search_timeout_s": float("inf")}, "search_timeout_s must be a number of seconds from"),
        ({"search_backoff_s": float("nan")}, "search_backoff_s must be a number of seconds from 0 to 30"),
        # issue 27: settings that held a served graph's only worker forever, or failed with a TypeError
        ({"search_rate_limit": -1}, r"search_rate_limit must be an integer from 1 to 10000 \(or unset"),
        ({"search_rate_limit": 0}, "search_rate_limit must be an integer from 1"),
        ({"search_retries": 10**9}, "search_retries must be an integer from 0 to 10"),
        ({"search_retries": "3"}, "search_retries must be an integer from 0 to 10, got '3'"),
        ({"search_timeout_s": 1e9}, "search_timeout_s must be a number of seconds from 0.001 to 120"),
        ({"max_turns": 10**6}, "max_turns must be an integer from 1 to 32"),
        ({"max_new_tokens": 4096}, "max_new_tokens must be an integer from 1 to 1024"),
        ({"max_turns": True}, "max_turns must be an integer"),
        ({"run_timeout_s": 0}, "run_timeout_s must be a number of seconds from 0.001 to 3600"),
        ({"demonstration": "yes"}, "demonstration must be true or false"),
        ({"demonstration": True, "protocol": "tools"}, "the tools protocol has none"),  # it was left out, silently
    ],
)
def test_unbounded_settings_are_refused(setting, message):
    with pytest.raises(ValueError, match=message):
        ParallelSearchAgent(**setting)


def test_a_question_that_is_not_text_is_a_value_error():
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever())
    with pytest.raises(
        ValueError, match=r"question is not valid text: '.+udcff.+udcfe' at character 3 .*expected UTF-8 text"
    ):
        agent.invoke({"question": "caf\udcff\udcfe?"})  # what Python makes of non-UTF-8 bytes in argv


class MalformedRetriever:
    """Test double: answers with the given malformed value."""

    def __init__(self, value) -> None:
        self.value = value
        self.calls = 0

    async def asearch(self, queries, k):
        self.calls += 1
        return self.value


@pytest.mark.parametrize(
    "value",
    [
        [[None]],
        None,
        [],
        [["a passage as text"]],
        "text",
        [[{"id": 1}]],
        [[Passage(id="1", title=None, text="a passage without a title")]],  # crashed observe with a TypeError
        [[Passage(id=1, title="T", text=b"bytes")]],
        [[Passage(id="1", title="T", text="t", score=float("nan"))]],  # the record's JSON line was unreadable
        [[Passage(id="1", title="T", text="t", score="high")]],
    ],
)
def test_malformed_retriever_answers_are_failed_searches_not_retried(value):
    retriever = MalformedRetriever(value)
    agent = ParallelSearchAgent(llm=scripted_llm("<search> a </search>", ANSWER), retriever=retriever, search_retries=2)
    out = agent.invoke({"question": "Q?"})
    result = out["trajectory"]["search_rounds"][0]["results"][0]
    assert result["error"].startswith("MalformedResults: retriever returned") and "expected a " in result["error"]
    assert result["attempts"] == retriever.calls == 1  # asked again, it answers the same
    assert out["answer"] == "Paris"


class SelfCancellingRetriever:
    """Test double: a backend whose own request task was cancelled (the run itself was not)."""

    async def asearch(self, queries, k):
        raise asyncio.CancelledError("the client's request task was cancelled")


def test_a_retriever_that_cancels_itself_is_a_failed_search_not_a_cancelled_run():
    agent = ParallelSearchAgent(
        llm=scripted_llm("<search> a </search>", ANSWER), retriever=SelfCancellingRetriever(), search_retries=0
    )
    out = agent.invoke({"question": "Q?"})
    assert out["trajectory"]["search_rounds"][0]["results"][0]["error"].startswith("CancelledError")
    assert out["answer"] == "Paris"


class BlockingRetriever(SleepyRetriever):
    """Test double: query ``block`` blocks the event loop (sync sleep in async code); others are healthy."""

    async def asearch(self, queries, k):
        if queries == ["block"]:
            time.sleep(0.5)
        return await super().asearch(queries, k)


def test_a_blocking_retriever_does_not_get_healthy_searches_blamed():
    agent = ParallelSearchAgent(
        llm=scripted_llm("<search> a ## b ## block ## c </search>", ANSWER),
        retriever=BlockingRetriever(delay_s=0.01),
        search_timeout_s=0.2,
        search_retries=0,
    )
    out = agent.invoke({"question": "Q?"})
    errors = {r["sub_query"]: r["error"] for r in out["trajectory"]["search_rounds"][0]["results"]}
    assert [errors[q] for q in "abc"] == [None, None, None]  # their results were in when the loop came back


def test_missing_corpus_file_says_what_was_expected(tmp_path):
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"corpus file not found.*expected a jsonl file"):
        agent.invoke({"question": "Q?"})


def test_unknown_llm_spec_says_what_was_expected():
    agent = ParallelSearchAgent(llm="gpt", retriever=SleepyRetriever())
    with pytest.raises(ValueError, match=r"unknown LLM spec 'gpt'.*smollm2"):
        agent.invoke({"question": "Q?"})


def test_stream_batch_and_string_input():
    agent = ParallelSearchAgent(llm=FakeListLLM(responses=[FOUR, ANSWER] * 3), retriever=SleepyRetriever())
    nodes = [next(iter(chunk)) for chunk in agent.stream("Q?")]
    assert nodes[:2] == ["prepare", "think"] and nodes.count("search") == 4 and nodes[-1] == "finish"
    outs = agent.batch([{"question": "Q1?"}, {"question": "Q2?"}], config={"max_concurrency": 1})
    assert [o["answer"] for o in outs] == ["Paris", "Paris"]


def test_configurable_overrides_per_run():
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=SleepyRetriever())
    out = agent.invoke({"question": "Q?"}, config={"configurable": {"mode": "sequential", "topk": 1}})
    assert out["trajectory"]["mode"] == "sequential"
    assert out["trajectory"]["search_rounds"][0]["searched"] == ["ant ## bee ## cat ## dog"]
    assert len(out["trajectory"]["search_rounds"][0]["results"][0]["passages"]) == 1


def test_as_tool_returns_the_answer():
    tool = ParallelSearchAgent(llm=FakeListLLM(responses=[ANSWER] * 2), retriever=SleepyRetriever()).as_tool()
    assert tool.name == "parallel_search"
    assert tool.invoke({"question": "Q?"}) == "Paris"
    assert asyncio.run(tool.ainvoke({"question": "Q?"})) == "Paris"


def test_as_tool_takes_langchains_arguments_and_refuses_a_schema_it_cannot_honour():
    """args_schema and arg_types were silently ignored, and a schema given first became the tool's name."""
    agent = ParallelSearchAgent(llm=FakeListLLM(responses=[ANSWER]), retriever=SleepyRetriever())
    tool = agent.as_tool(name="wiki_answer", description="Answers from Wikipedia.")
    assert (tool.name, tool.description) == ("wiki_answer", "Answers from Wikipedia.")
    assert agent.as_tool(name=None).name == "parallel_search"
    with pytest.raises(TypeError, match=r"as_tool takes no args_schema or arg_types: the tool's input is"):
        agent.as_tool(arg_types={"query": str})
    with pytest.raises(TypeError, match=r"as_tool takes no args_schema or arg_types"):
        agent.as_tool(dict)


def test_as_tool_passes_the_calls_config_to_the_run():
    retriever = SleepyRetriever()
    tool = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER, FOUR, ANSWER), retriever=retriever).as_tool()
    sequential = {"configurable": {"mode": "sequential"}}
    assert tool.invoke("Q?", config=sequential) == "Paris"
    assert asyncio.run(tool.ainvoke("Q?", config=sequential)) == "Paris"
    assert retriever.calls == [["ant ## bee ## cat ## dog"]] * 2  # searched whole, as sequential mode does


class SearchThenAnswer(LLM):
    """Test double: a policy that searches on a run's first turn and answers once it has read."""

    @property
    def _llm_type(self) -> str:
        return "search-then-answer"

    def _call(self, prompt, stop=None, run_manager=None, **kwargs):
        return ANSWER if "Doc 1(Title:" in prompt else "<search> a </search>"  # read an observation


@pytest.mark.parametrize("path", ["batch", "abatch"])
def test_batch_runs_at_most_the_agents_max_concurrency_at_once(path):
    """``max_concurrency`` bounds batch runs, as its description says; batch took it from its config only."""
    retriever = InFlightRetriever(expect=2)
    agent = ParallelSearchAgent(llm=SearchThenAnswer(), retriever=retriever, max_concurrency=2)
    questions = [f"Q{i}?" for i in range(6)]
    outs = agent.batch(questions) if path == "batch" else asyncio.run(agent.abatch(questions))
    assert [o["answer"] for o in outs] == ["Paris"] * 6 and len(retriever.calls) == 6
    assert retriever.peak == 2, f"{retriever.peak} runs searched at once, with max_concurrency=2"


def test_a_context_given_to_a_run_is_refused_saying_where_settings_go():
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever())
    with pytest.raises(TypeError, match=r"to the constructor, or per run as config=\{'configurable': \{\.\.\.\}\}"):
        agent.invoke("Q?", context={"mode": "sequential"})


def test_graph_works_as_a_subgraph():
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=SleepyRetriever())
    parent = StateGraph(dict)
    parent.add_node("research", agent.graph)
    parent.add_edge(START, "research")
    parent.add_edge("research", END)
    out = parent.compile().invoke({"question": ANIMALS})
    assert out["answer"] == "Paris" and out["stats"]["decomposed"]


def test_a_prefixed_agent_reads_only_its_own_keys_of_a_parent_apps_configurable():
    """A parent app's own ``configurable`` (its ``llm``, its ``mode``) reached the agent it runs as a node: the
    parent's model name was refused as not offered, and its mode changed the agent's."""
    chosen = scripted_llm(FOUR, ANSWER)
    agent = ParallelSearchAgent(
        llm=scripted_llm(ANSWER),
        retriever=SleepyRetriever(),
        choices=Choices(llms={"scripted": chosen}),
        configurable_prefix="research_",
    )
    parent = StateGraph(dict)
    parent.add_node("research", agent)
    parent.add_edge(START, "research")
    parent.add_edge("research", END)
    own = {"llm": "openai:gpt-4o", "mode": "sequential", "thread_id": "t1"}
    mine = {"research_llm": "scripted", "research_topk": 1}
    out = parent.compile().invoke({"question": ANIMALS}, {"configurable": own | mine})
    assert out["answer"] == "Paris" and out["trajectory"]["mode"] == "parallel" and out["stats"]["decomposed"]
    assert [len(r["passages"]) for r in out["trajectory"]["search_rounds"][0]["results"]] == [1] * 4
    with pytest.raises(ValueError, match=r"prefix 'research_' names an unknown setting 'mdoe' \(did you mean 'mode'"):
        agent.invoke("Q?", {"configurable": {"research_mdoe": "sequential"}})
    with pytest.raises(TypeError, match=r"configurable_prefix must be a string, got int"):
        ParallelSearchAgent(llm=chosen, retriever=SleepyRetriever(), configurable_prefix=1)


def test_trajectory_and_stats_are_consistent():
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, "<search> e </search>", ANSWER), retriever=SleepyRetriever())
    out = agent.invoke({"question": "Q?"})
    trajectory, stats = out["trajectory"], out["stats"]
    assert stats["llm_calls"] == len(trajectory["llm_calls"]) == 3
    assert stats["search_rounds"] == len(trajectory["search_rounds"]) == 2
    assert stats["sub_queries"] == 5
    assert [c["turn"] for c in trajectory["llm_calls"]] == [1, 2, 3]
    for call in trajectory["llm_calls"][1:]:
        assert call["prompt"].startswith(trajectory["prompt"])
    assert trajectory["response"].startswith(FOUR)
    assert stats["latency_s"] > 0


def _without_timings(value):
    """State values with what differs from run to run (times, message ids) left out."""
    if isinstance(value, dict):
        skipped = {"latency_s", "started_at", "round_started", "deadline", "id"}
        return {k: _without_timings(v) for k, v in value.items() if k not in skipped}
    if isinstance(value, list | tuple):
        return [_without_timings(v) for v in value]
    if hasattr(value, "model_dump"):  # a LangChain message
        return _without_timings(value.model_dump())
    return value


@pytest.mark.parametrize("protocol", ["tags", "tools"])
def test_a_second_question_on_a_thread_starts_afresh(protocol):
    """Under a checkpointer (LangGraph Server and Studio run every graph on one), a thread keeps the last run's
    state. Its answer ended the next run at once, and its turns reached the model: the second question on a
    thread got the first one's answer. Its thread's state must be what a new thread's is after that question."""
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from ps_agent.testing import ToolCallingFakeChatModel, tool_calls

    def policy(city: str):
        if protocol == "tags":
            return [f"<search> capital of {city} </search>", f"<answer> {city} answer </answer>"]
        return [tool_calls(f"capital of {city}"), AIMessage(f"{city} answer")]

    def llm(*cities: str):
        turns = [turn for city in cities for turn in policy(city)]
        return scripted_llm(*turns) if protocol == "tags" else ToolCallingFakeChatModel(messages=iter(turns))

    served = graph.copy(update={"checkpointer": InMemorySaver()})

    def run(thread: str, context: Context, *cities: str) -> dict:
        config = {"configurable": {"thread_id": thread}}
        outputs = [served.invoke({"question": f"Capital of {city}?"}, config, context=context) for city in cities]
        return {"output": outputs[-1], "state": served.get_state(config).values}

    both = run(
        "reused", Context(llm=llm("France", "Italy"), corpus=SleepyRetriever(), protocol=protocol), "France", "Italy"
    )
    alone = run("new", Context(llm=llm("Italy"), corpus=SleepyRetriever(), protocol=protocol), "Italy")
    assert both["output"]["answer"] == "Italy answer"
    assert both["output"]["stats"]["llm_calls"] == 2
    assert _without_timings(both["state"]) == _without_timings(alone["state"])


@pytest.mark.parametrize("fake", [" ## .", " ## Who was born first, Einstein or Newton"])
def test_a_split_that_adds_nothing_is_not_searched_twice_and_earns_no_decomposition(fake):
    """Appending " ## ." or the question reworded made a whole-question search count as decomposed, paying the
    parallel bonus (0.45 of a reward of ~1) and inflating the decomposition ratio."""
    from ps_agent.episodes import episode_record

    question = "Who was born first, Albert Einstein or Isaac Newton?"
    row = {"id": "q", "question": question, "golden_answers": ["Isaac Newton"], "question_type": "comparison"}
    search = f"<think> x </think>\n<search> Who was born first, Einstein or Newton?{fake} </search>"
    retriever = SleepyRetriever()
    answer = "<think> read </think>\n<answer> Isaac Newton </answer>"
    agent = ParallelSearchAgent(llm=scripted_llm(search, answer), retriever=retriever)
    out = agent.invoke(question)
    assert out["trajectory"]["search_rounds"][0]["searched"] == ["Who was born first, Einstein or Newton?"]
    assert retriever.calls == [["Who was born first, Einstein or Newton?"]] and out["stats"]["decomposed"] is False
    assert episode_record(row, out)["rewards"]["decomposition"] == 0.0


def test_a_search_of_no_words_is_told_so_and_searches_nothing():
    retriever = SleepyRetriever()
    answer = "<think> read </think>\n<answer> Paris </answer>"
    agent = ParallelSearchAgent(
        llm=scripted_llm("<think> x </think>\n<search> . ## ?! </search>", answer), retriever=retriever
    )
    out = agent.invoke("What is the capital of France?")
    assert "Nothing was searched: each sub-query needs words" in out["trajectory"]["llm_calls"][1]["prompt"]
    # no round was searched: the turn is invalid, so it earns no search-count credit and breaks the format
    assert retriever.calls == [] and out["trajectory"]["search_rounds"] == [] and out["stats"]["search_rounds"] == 0
    first = out["trajectory"]["llm_calls"][0]
    assert (first["action"], first["error"]) == ("invalid", "no sub-query has a word to search for")
    assert not format_valid(out["trajectory"]) and search_count_component(out["trajectory"], "comparison", W) < 0


def test_an_unknown_setting_names_the_one_meant_and_the_agents_settings():
    """It raised "Context.__init__() got an unexpected keyword argument 'max_turn'": another class, no names."""
    with pytest.raises(TypeError, match=r"unknown setting 'max_turn' \(did you mean 'max_turns'\?\): expected some"):
        ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever(), max_turn=3)


@pytest.mark.parametrize("path", ["batch", "abatch"])
def test_batch_runs_at_most_a_runs_configurable_max_concurrency_at_once(path):
    """A per-run ``configurable`` sets any setting; batch wrote the agent's own 16 over it."""
    retriever = InFlightRetriever(expect=2)
    agent = ParallelSearchAgent(llm=SearchThenAnswer(), retriever=retriever)
    questions, one = [f"Q{i}?" for i in range(4)], {"configurable": {"max_concurrency": 1}}
    outs = agent.batch(questions, one) if path == "batch" else asyncio.run(agent.abatch(questions, one))
    assert [o["answer"] for o in outs] == ["Paris"] * 4 and len(retriever.calls) == 4
    assert retriever.peak == 1, f"{retriever.peak} runs searched at once, with max_concurrency=1"


class CountingCallbacks(BaseCallbackHandler):
    """Test double: counts the model calls a run's callbacks see."""

    def __init__(self) -> None:
        self.llm_starts = 0

    def on_llm_start(self, serialized, prompts, **kwargs):
        self.llm_starts += 1


@pytest.mark.parametrize("path", ["invoke", "ainvoke"])
def test_a_runs_callbacks_reach_every_call_of_a_langchain_llm(path):
    agent = ParallelSearchAgent(llm=scripted_llm(FOUR, ANSWER), retriever=SleepyRetriever())
    callbacks = CountingCallbacks()
    config = {"callbacks": [callbacks]}
    out = agent.invoke("Q?", config) if path == "invoke" else asyncio.run(agent.ainvoke("Q?", config))
    assert out["stats"]["llm_calls"] == 2 and callbacks.llm_starts == 2


def test_a_chain_streams_the_agents_output_to_the_next_step():
    agent = ParallelSearchAgent(llm=scripted_llm(*[FOUR, ANSWER] * 4), retriever=SleepyRetriever())
    answer = agent | RunnableLambda(lambda out: out["answer"])
    assert list(answer.stream("Q?")) == ["Paris"]
    assert list(agent.pick("answer").stream("Q?")) == ["Paris"]

    async def astreamed():
        return [chunk async for chunk in answer.astream("Q?")]

    assert asyncio.run(astreamed()) == ["Paris"]
    nodes = [next(iter(chunk)) for chunk in agent.stream("Q?")]  # the agent alone still streams its node updates
    assert nodes[0] == "prepare" and nodes[-1] == "finish"


def test_a_prompt_templates_value_asks_its_human_message():
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever())
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
    out = (prompt | agent).invoke({"q": "Which is older?"})
    assert out["answer"] == "Paris" and out["trajectory"]["question"] == "Which is older?"


def test_a_wrapped_agent_becomes_a_tool_of_one_question_argument():
    agent = ParallelSearchAgent(llm=scripted_llm(ANSWER), retriever=SleepyRetriever())
    tool = agent.with_retry(stop_after_attempt=2).as_tool(name="research")
    assert list(tool.args) == ["question"]
    assert tool.invoke({"question": "Q?"})["answer"] == "Paris"


def test_an_agent_error_crosses_processes_whole():
    error = AgentError("LLM call failed on turn 2: boom", {"question": "Q?"}, {"llm_calls": 1})
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.trajectory, copy.stats) == (str(error), error.trajectory, error.stats)


def test_a_search_a_client_sends_itself_is_checked_and_bounded_as_a_question_is():
    """A served graph's client may ``goto`` the search node with ``Send``s of its own, skipping ``prepare``."""
    retriever = SleepyRetriever()
    served = compile_graph()
    served.checkpointer = InMemorySaver()
    context = Context(llm=scripted_llm(ANSWER), corpus=retriever, max_question_chars=50)
    thread = {"configurable": {"thread_id": "client-made"}}
    # a thread that ran, as a client's has: on an empty one, the command's search raced `prepare` (no question)
    assert served.invoke({"question": "Q?"}, thread, context=context)["answer"] == "Paris"
    with pytest.raises(ValueError, match=r"a search task is \{'index': int, 'sub_query': str.*got \{'sub_query': 5\}"):
        served.invoke(Command(goto=[Send("search", {"sub_query": 5})]), thread, context=context)
    with contextlib.suppress(Exception):  # the run fails after the search: no round of its own was pending
        served.invoke(Command(goto=[Send("search", {"index": 0, "sub_query": "x" * 10_000})]), thread, context=context)
    assert retriever.calls == [["x" * 50]]
