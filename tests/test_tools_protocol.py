"""The ``tools`` policy protocol: parallel tool calls of one message are one search round."""

from langchain_core.messages import AIMessage, ToolMessage

from ps_agent import ParallelSearchAgent
from ps_agent.policy_protocols import TOOLS_FORCED_MESSAGE
from ps_agent.testing import InFlightRetriever, SleepyRetriever, ToolCallingFakeChatModel, tool_calls


def chat(*messages):
    return ToolCallingFakeChatModel(messages=iter(messages))


def test_parallel_tool_calls_are_one_parallel_round():
    model = chat(tool_calls("Eiffel Tower built", "Statue of Liberty built"), AIMessage("The Statue of Liberty"))
    retriever = InFlightRetriever(expect=2)
    agent = ParallelSearchAgent(llm=model, retriever=retriever, protocol="tools")
    out = agent.invoke({"question": "Which is older, the Eiffel Tower or the Statue of Liberty?"})
    assert retriever.peak == 2, f"{retriever.peak} of a round's 2 searches were in flight at once"
    assert out["answer"] == "The Statue of Liberty"
    assert out["stats"] | {"llm_calls": 2, "search_rounds": 1, "sub_queries": 2, "decomposed": True} == out["stats"]
    assert model.bound_tools[0]["function"]["name"] == "search"
    assert [c["action"] for c in out["trajectory"]["llm_calls"]] == ["search", "answer"]


def test_every_tool_call_gets_its_tool_message():
    model = chat(tool_calls("a", "a", ""), AIMessage("done"))
    agent = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools")
    state = agent.graph.invoke({"question": "Q?"}, output_keys=["messages", "search_rounds"])
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_messages] == ["call_0", "call_1", "call_2"]
    assert tool_messages[0].content == tool_messages[1].content
    assert "Doc 1(Title: Title of a)" in tool_messages[0].content
    assert tool_messages[2].content.startswith('Search failed: no words to search for; call search with {"query"')
    assert state["search_rounds"][0]["searched"] == ["a"]


def test_sequential_mode_runs_only_the_first_tool_call():
    model = chat(tool_calls("a", "b"), tool_calls("b"), AIMessage("done"))
    retriever = SleepyRetriever()
    agent = ParallelSearchAgent(llm=model, retriever=retriever, protocol="tools", mode="sequential")
    state = agent.graph.invoke({"question": "Q?"}, output_keys=["messages", "stats"])
    assert retriever.calls == [["a"], ["b"]]
    skipped = [m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "call_1"]
    assert skipped[0].content == "Not searched: one search per turn in sequential mode."
    assert state["stats"]["decomposed"] is False


def test_max_turns_forces_a_final_answer_without_tools():
    model = chat(tool_calls("a"), tool_calls("b"), AIMessage("Rome"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools", max_turns=2).invoke("Q?")
    assert out["answer"] == "Rome" and out["stats"]["forced_answer"] and out["stats"]["llm_calls"] == 3


def test_empty_reply_is_invalid_and_nudged():
    model = chat(AIMessage(""), AIMessage("<answer> Oslo </answer>"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools").invoke("Q?")
    assert [c["action"] for c in out["trajectory"]["llm_calls"]] == ["invalid", "answer"]
    assert out["answer"] == "Oslo"


def test_tools_protocol_needs_a_chat_model():
    import pytest

    with pytest.raises(ValueError, match="tools protocol needs a chat model"):
        ParallelSearchAgent(retriever=SleepyRetriever(), protocol="tools").invoke("Q?")


def test_a_call_with_arguments_that_are_not_json_or_without_an_id_is_answered():
    """A call the model botched (its arguments cut off, so not JSON) is one LangChain keeps apart as invalid;
    left unanswered, the next request is one OpenAI's API refuses (every tool call needs its tool message).
    A call without an id crashed the run with a pydantic error."""
    botched = AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": "search",
                "args": '{"query": "capital of Fr',
                "id": "c0",
                "error": None,
                "type": "invalid_tool_call",
            }
        ],
        tool_calls=[{"name": "search", "args": {"query": "France"}, "id": None, "type": "tool_call"}],
    )
    model = chat(botched, AIMessage("Paris"))
    agent = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools")
    state = agent.graph.invoke({"question": "Q?"}, output_keys=["messages", "search_rounds", "answer"])
    answered = {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    assert sorted(answered) == ["c0", "call_0"]
    assert answered["c0"].startswith("Search failed: its arguments were not valid JSON")
    assert "France" in answered["call_0"]
    assert [r["searched"] for r in state["search_rounds"]] == [["France"]] and state["answer"] == "Paris"


def test_a_clean_tools_episode_is_format_valid_and_an_invalid_turn_is_not():
    """Every tools-protocol episode was format-invalid (its turns have no tags), so a right answer lost λf."""
    from ps_agent.rewards import format_valid, reward_components

    model = chat(tool_calls("Eiffel Tower built", "Statue of Liberty built"), AIMessage("The Statue of Liberty"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools").invoke("Which is older?")
    assert format_valid(out["trajectory"])
    parts = reward_components(out["trajectory"], ["Statue of Liberty"], "comparison")
    assert (parts["outcome"], parts["format"]) == (1.0, 0.0)
    model = chat(AIMessage(""), tool_calls("Eiffel Tower built"), AIMessage("The Statue of Liberty"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools").invoke("Which is older?")
    assert out["trajectory"]["llm_calls"][0]["action"] == "invalid" and not format_valid(out["trajectory"])


def test_a_call_to_another_tool_or_with_a_query_that_is_not_text_is_answered_and_not_searched():
    """An unknown tool ran as a search, and a null query searched the text "None"."""
    calls = [
        {"name": "delete_files", "args": {"query": "Einstein birth"}, "id": "c0", "type": "tool_call"},
        {"name": "search", "args": {"query": None}, "id": "c1", "type": "tool_call"},
        {"name": "search", "args": {"query": ["Einstein", "Newton"]}, "id": "c2", "type": "tool_call"},
        {"name": "search", "args": {"query": "Newton birth"}, "id": "c3", "type": "tool_call"},
    ]
    retriever = SleepyRetriever()
    model = chat(AIMessage("", tool_calls=calls), AIMessage("Isaac Newton"))
    agent = ParallelSearchAgent(llm=model, retriever=retriever, protocol="tools")
    state = agent.graph.invoke({"question": "Q?"}, output_keys=["messages", "search_rounds", "answer"])
    answered = {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, ToolMessage)}
    assert answered["c0"].startswith("Search failed: there is no tool 'delete_files'; the only tool is search")
    assert answered["c1"].startswith("Search failed: query must be a string, got NoneType")
    assert answered["c2"].startswith("Search failed: query must be a string, got list")
    assert retriever.calls == [["Newton birth"]] and state["search_rounds"][0]["searched"] == ["Newton birth"]


def test_a_turn_whose_every_call_was_refused_records_why():
    """Its record said "no sub-query has a word to search for"; the model was told the real reason."""
    calls = [{"name": "delete_files", "args": {"query": "Einstein birth"}, "id": "c0", "type": "tool_call"}]
    agent = ParallelSearchAgent(
        llm=chat(AIMessage("", tool_calls=calls), AIMessage("Isaac Newton")), retriever=SleepyRetriever(),
        protocol="tools",
    )  # fmt: skip
    first = agent.invoke({"question": "Q?"})["trajectory"]["llm_calls"][0]
    assert first["action"] == "invalid" and first["error"].startswith("there is no tool 'delete_files'")


def test_a_plain_answer_after_thinking_is_the_answer_alone():
    model = chat(AIMessage("<think>Newton 1642, Einstein 1879.</think>\n\nIsaac Newton"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools").invoke({"question": "Q?"})
    assert out["answer"] == "Isaac Newton"


def test_a_reply_cut_at_the_token_cap_is_an_invalid_turn_not_the_answer():
    cut = AIMessage("The capital of France is Pa", response_metadata={"finish_reason": "length"})
    model = chat(cut, AIMessage("Paris"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools").invoke("Capital of France?")
    assert out["answer"] == "Paris"
    first, second = out["trajectory"]["llm_calls"]
    assert (first["action"], first["error"]) == ("invalid", "cut at the token cap (max_new_tokens)")
    assert second["action"] == "answer"


def test_the_forced_turn_records_the_message_that_forced_it():
    model = chat(tool_calls("a"), AIMessage("Rome"))
    out = ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools", max_turns=1).invoke("Q?")
    forced = out["trajectory"]["llm_calls"][-1]
    assert forced["action"] == "forced_answer"
    assert forced["prompt"].endswith("Human: " + TOOLS_FORCED_MESSAGE)


def test_a_chat_model_without_tool_calling_is_refused_before_the_run_naming_the_tags_protocol():
    import pytest
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    model = FakeListChatModel(responses=["<answer>x</answer>"])
    with pytest.raises(ValueError, match=r"FakeListChatModel has none \(no bind_tools\): use protocol='tags'"):
        ParallelSearchAgent(llm=model, retriever=SleepyRetriever(), protocol="tools").invoke("Q?")
