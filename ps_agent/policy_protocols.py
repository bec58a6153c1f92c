"""The two policy protocols behind one interface: how the agent talks to its model.

``tags`` is Search-R1's text protocol (``<search> a ## b </search>`` in a ``TextPolicy``'s text, token ids kept);
``tools`` is native tool calling (a chat model's ``search`` calls of one message are one round). The graph's
``think`` and ``observe`` nodes call the protocol the context names, through ``PROTOCOLS``. The text itself
(prompts, parsing, rendering) is ``ps_agent.protocol``; the tools protocol's own messages are here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from langchain_core.messages import HumanMessage, ToolMessage, get_buffer_string

from ps_agent.context import Context
from ps_agent.llms import Completion, cut_at_token_limit, token_cap
from ps_agent.protocol import (
    FORCED_ANSWER_PROMPT,
    INVALID_ACTION_MESSAGE,
    STOP_SEQUENCES,
    SubQueryObservation,
    neutralise,
    parse_action,
    parse_forced_answer,
    render_chat_prompt,
    render_information,
    render_prompt,
    sub_query_key,
)
from ps_agent.state import AgentState, PendingRound, Segment

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the knowledge corpus; returns the top passages for the query.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "one self-contained search query"}},
            "required": ["query"],
        },
    },
}
#: Instructions for the ``tools`` policy protocol (native tool calling).
TOOLS_PROMPT = (
    "Answer the given question. Think step by step. If you lack some knowledge, call the `search` tool; "
    "{parallel_hint}"
    "When no further knowledge is needed, reply with the final answer only, as a short phrase "
    "without explanation. Question: {question}"
)
TOOLS_PARALLEL_HINT = (
    "if the question has independent parts, call `search` once per part in the same message, "
    "so the searches run in parallel. "
)
TOOLS_SEQUENTIAL_HINT = "call it with one query at a time. "
TOOLS_INVALID_MESSAGE = "Your previous message had neither a search tool call nor a complete answer. Try again."
TOOLS_FORCED_MESSAGE = "You have used all your searches. Reply now with the final answer only, as a short phrase."


@dataclass(frozen=True)
class Turn:
    """What one model turn wrote (``update``: its transcript segments or messages) and what it asked for."""

    completion: Completion
    action: Literal["search", "answer", "invalid", "forced_answer"]
    update: dict[str, Any]
    answer: str | None = None
    sub_queries: list[str] = field(default_factory=list)
    tool_call_ids: list[str] = field(default_factory=list)
    call_errors: list[str | None] = field(default_factory=list)  # why each tool call was not searched, if it was not
    error: str | None = None


class PolicyProtocol(Protocol):
    """How the agent talks to its model: the prompt, one turn, and what the model reads back."""

    def load(self, context: Context) -> object:
        """The model this protocol calls, resolved (and loaded: a first call may take seconds)."""

    def start(self, question: str, context: Context) -> dict[str, Any]:
        """The prompt of a run, as state."""

    async def think(self, state: AgentState, context: Context, forced: bool) -> Turn:
        """One model turn; ``forced``: the last one, which must answer."""

    def retry(self) -> dict[str, Any]:
        """What the model reads after an invalid turn."""

    def observation(
        self, pending: PendingRound, results: dict[str, SubQueryObservation], context: Context
    ) -> dict[str, Any]:
        """What the model reads after a search round."""


def _env(text: str) -> Segment:
    return {"role": "env", "text": text, "token_ids": None}


class TagsProtocol:
    """Search-R1's text protocol: ``<search>``/``<answer>`` in the text of a ``TextPolicy`` (token ids kept)."""

    def load(self, context: Context) -> object:
        return context.policy

    def start(self, question: str, context: Context) -> dict[str, Any]:
        return {
            "prompt": render_prompt(question, context.mode),
            "prompt_messages": render_chat_prompt(question, context.mode, context.demonstration),
        }

    async def think(self, state: AgentState, context: Context, forced: bool) -> Turn:
        new = [_env(FORCED_ANSWER_PROMPT)] if forced else []
        completion = await context.policy.acomplete(
            state["prompt_messages"],
            state.get("transcript", []) + new,
            stop=["</answer>"] if forced else list(STOP_SEQUENCES),
            max_tokens=context.max_new_tokens,
        )
        update = {"transcript": [*new, Segment(role="model", text=completion.text, token_ids=completion.token_ids)]}
        if forced:
            answer = parse_forced_answer(completion.text)
            return Turn(completion, "forced_answer", update, answer, error=None if answer else "empty final answer")
        action = parse_action(completion.text, context.mode)
        answer = action.content if action.kind == "answer" else None
        return Turn(completion, action.kind, update, answer, sub_queries=list(action.sub_queries), error=action.error)

    def retry(self) -> dict[str, Any]:
        return {"transcript": [_env(INVALID_ACTION_MESSAGE)]}

    def observation(
        self, pending: PendingRound, results: dict[str, SubQueryObservation], context: Context
    ) -> dict[str, Any]:
        note = None
        if not results:  # no sub-query had a word to search for
            note = "Nothing was searched: each sub-query needs words to search for, sub-queries separated by ##."
        elif pending["capped_from"]:
            note = (
                f"Only the first {context.max_parallel} of {pending['capped_from']} sub-queries were searched "
                f"(max_parallel={context.max_parallel})."
            )
        return {"transcript": [_env(render_information(list(results.values()), note))]}


class ToolsProtocol:
    """Native tool calling: a chat model calls the ``search`` tool, once per sub-query, in one message."""

    def load(self, context: Context) -> object:
        return context.chat_model

    def start(self, question: str, context: Context) -> dict[str, Any]:
        hint = TOOLS_PARALLEL_HINT if context.mode == "parallel" else TOOLS_SEQUENTIAL_HINT
        prompt = TOOLS_PROMPT.format(parallel_hint=hint, question=neutralise(question))
        return {"prompt": prompt, "messages": [HumanMessage(prompt)]}

    async def think(self, state: AgentState, context: Context, forced: bool) -> Turn:
        model = context.chat_model
        new = [HumanMessage(TOOLS_FORCED_MESSAGE)] if forced else []
        runnable = model if forced else model.bind_tools([SEARCH_TOOL])
        reply = await runnable.ainvoke(state["messages"] + new, **token_cap(model, context.max_new_tokens))
        usage = reply.usage_metadata or {}
        completion = Completion(
            text=reply.text
            + "".join(json.dumps(call["args"]) for call in reply.tool_calls)
            + "".join(str(call["args"] or "") for call in reply.invalid_tool_calls),
            prompt_text=get_buffer_string(state["messages"] + new),
            prompt_tokens=usage.get("input_tokens"),
            completion_tokens=usage.get("output_tokens"),
            finish_reason=reply.response_metadata.get("finish_reason"),
        )
        update = {"messages": [*new, reply]}
        # a call whose arguments were not JSON is invalid, but still a call: it is answered, as an empty query is
        # (an unanswered call is an error at OpenAI's API); a call without an id gets one for its answer
        calls = [*reply.tool_calls, *reply.invalid_tool_calls]
        if calls and not forced:
            refused = [_refusal(call) for call in reply.tool_calls]
            refused += [f"its arguments were not valid JSON: {call.get('args')!r}" for call in reply.invalid_tool_calls]
            queries = [
                call["args"]["query"].strip() if not why else "" for call, why in zip(calls, refused, strict=True)
            ]
            ids = [call.get("id") or f"call_{i}" for i, call in enumerate(calls)]
            return Turn(completion, "search", update, sub_queries=queries, tool_call_ids=ids, call_errors=refused)
        if not forced and cut_at_token_limit(completion.finish_reason, reply.response_metadata):
            return Turn(completion, "invalid", update, error="cut at the token cap (max_new_tokens)")
        if answer := parse_forced_answer(reply.text):
            return Turn(completion, "forced_answer" if forced else "answer", update, answer=answer)
        if forced:
            return Turn(completion, "forced_answer", update, answer="", error="empty final answer")
        return Turn(completion, "invalid", update, error="no tool call and no answer")

    def retry(self) -> dict[str, Any]:
        return {"messages": [HumanMessage(TOOLS_INVALID_MESSAGE)]}

    def observation(
        self, pending: PendingRound, results: dict[str, SubQueryObservation], context: Context
    ) -> dict[str, Any]:
        calls = zip(pending["sub_queries"], pending["tool_call_ids"], pending["call_errors"], strict=True)
        return {"messages": [ToolMessage(self._result(q, e, results, context), tool_call_id=i) for q, i, e in calls]}

    @staticmethod
    def _result(query: str, error: str | None, results: dict[str, SubQueryObservation], context: Context) -> str:
        if error or not sub_query_key(query):
            why = error or "no words to search for"
            return f'Search failed: {why}; call search with {{"query": "<what to search for>"}}.'
        found = next((result for q, result in results.items() if sub_query_key(q) == sub_query_key(query)), None)
        if found is None:
            if context.mode == "sequential":
                return "Not searched: one search per turn in sequential mode."
            return f"Not searched: at most {context.max_parallel} searches per round (max_parallel)."
        return render_information([found]).strip()  # its own, or that of the same query written alike


def _refusal(call: Mapping[str, Any]) -> str | None:
    """Why a parsed tool call is not a search: another tool's name, or a query that is not text."""
    if call["name"] != SEARCH_TOOL["function"]["name"]:
        return f"there is no tool {call['name']!r}; the only tool is search"
    query = call["args"].get("query")
    if not isinstance(query, str):
        return f"query must be a string, got {type(query).__name__}"
    return None


PROTOCOLS: dict[str, PolicyProtocol] = {"tags": TagsProtocol(), "tools": ToolsProtocol()}
