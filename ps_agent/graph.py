"""The agent's graph: module-level nodes that read ``runtime.context`` (a ``Context``), then the wiring.

START → prepare → think ─┬─ search ×k (one Send per distinct sub-query, in parallel) → observe → think
                         ├─ observe (invalid action: the protocol's retry message) → think
                         └─ finish (an answer, or the forced answer after max_turns) → END

``think`` speaks the policy protocol the context names: ``tags`` (Search-R1's text, ``<search> a ## b </search>``,
token-exact) or ``tools`` (native tool calling: the ``search`` calls of one message are one round).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

from langchain_core.messages import HumanMessage, ToolMessage, get_buffer_string
from langchain_core.runnables import Runnable
from langgraph._internal._runnable import RunnableCallable  # LangGraph's node wrapper: a sync and an async function
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send

from ps_agent.configuration import AgentConfig
from ps_agent.context import Context
from ps_agent.llms import Completion, token_cap
from ps_agent.protocol import (
    FORCED_ANSWER_PROMPT,
    INVALID_ACTION_MESSAGE,
    STOP_SEQUENCES,
    TOOLS_PARALLEL_HINT,
    TOOLS_PROMPT,
    TOOLS_SEQUENTIAL_HINT,
    SubQueryObservation,
    neutralise,
    parse_action,
    parse_forced_answer,
    render_chat_prompt,
    render_information,
    render_prompt,
)
from ps_agent.retrieval import resilient_search
from ps_agent.runner import run_sync
from ps_agent.state import (
    AgentState,
    InputState,
    LLMCall,
    OutputState,
    PendingRound,
    SearchRound,
    SearchTask,
    Segment,
    SubQueryResult,
    stats_of,
    trajectory_of,
)
from ps_agent.text import lone_surrogates

logger = logging.getLogger(__name__)

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
TOOLS_INVALID_MESSAGE = "Your previous message had neither a search tool call nor an answer. Try again."
TOOLS_FORCED_MESSAGE = "You have used all your searches. Reply now with the final answer only, as a short phrase."


class AgentError(RuntimeError):
    """An LLM failure during a run; carries the partial trajectory and stats up to that point."""

    def __init__(self, message: str, trajectory: dict[str, Any], stats: dict[str, Any]) -> None:
        super().__init__(message)
        self.trajectory = trajectory
        self.stats = stats


# --- the two policy protocols behind one interface ----------------------------------------------


@dataclass(frozen=True)
class Turn:
    """What one model turn wrote (``update``: its transcript segments or messages) and what it asked for."""

    completion: Completion
    action: Literal["search", "answer", "invalid", "forced_answer"]
    update: dict[str, Any]
    answer: str | None = None
    sub_queries: list[str] = field(default_factory=list)
    tool_call_ids: list[str] = field(default_factory=list)
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
            return Turn(completion, "forced_answer", update, answer=parse_forced_answer(completion.text))
        action = parse_action(completion.text, context.mode)
        answer = action.content if action.kind == "answer" else None
        return Turn(completion, action.kind, update, answer, sub_queries=list(action.sub_queries), error=action.error)

    def retry(self) -> dict[str, Any]:
        return {"transcript": [_env(INVALID_ACTION_MESSAGE)]}

    def observation(
        self, pending: PendingRound, results: dict[str, SubQueryObservation], context: Context
    ) -> dict[str, Any]:
        note = None
        if pending["capped_from"]:
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
            text=reply.text + "".join(json.dumps(call["args"]) for call in reply.tool_calls),
            prompt_text=get_buffer_string(state["messages"]),
            prompt_tokens=usage.get("input_tokens"),
            completion_tokens=usage.get("output_tokens"),
            finish_reason=reply.response_metadata.get("finish_reason"),
        )
        update = {"messages": [*new, reply]}
        if reply.tool_calls and not forced:
            queries = [str(call["args"].get("query", "")).strip() for call in reply.tool_calls]
            ids = [call["id"] for call in reply.tool_calls]
            return Turn(completion, "search", update, sub_queries=queries, tool_call_ids=ids)
        if reply.text.strip():
            action = "forced_answer" if forced else "answer"
            return Turn(completion, action, update, answer=parse_forced_answer(reply.text))
        if forced:
            return Turn(completion, "forced_answer", update, answer="", error="empty final answer")
        return Turn(completion, "invalid", update, error="no tool call and no answer")

    def retry(self) -> dict[str, Any]:
        return {"messages": [HumanMessage(TOOLS_INVALID_MESSAGE)]}

    def observation(
        self, pending: PendingRound, results: dict[str, SubQueryObservation], context: Context
    ) -> dict[str, Any]:
        calls = zip(pending["sub_queries"], pending["tool_call_ids"], strict=True)
        return {"messages": [ToolMessage(self._result(q, results, context), tool_call_id=i) for q, i in calls]}

    @staticmethod
    def _result(query: str, results: dict[str, SubQueryObservation], context: Context) -> str:
        if not query:
            return "Search failed: empty query."
        if query not in results:
            if context.mode == "sequential":
                return "Not searched: one search per turn in sequential mode."
            return f"Not searched: at most {context.max_parallel} searches per round (max_parallel)."
        return render_information([results[query]]).strip()


PROTOCOLS: dict[str, PolicyProtocol] = {"tags": TagsProtocol(), "tools": ToolsProtocol()}


# --- the nodes ----------------------------------------------------------------------------------


async def prepare(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Check the question and load the model and retriever (off the event loop, failing fast) before turn one."""
    context = runtime.context
    question = state.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question is empty: expected a non-empty string, got {question!r}")
    if found := lone_surrogates(question):
        raise ValueError(
            f"question is not valid text: {found[0]!a} at character {found[1]} "
            "(a lone surrogate, e.g. undecodable bytes); expected UTF-8 text"
        )
    question = question.strip()
    truncated = len(question) > context.max_question_chars
    if truncated:
        logger.warning(
            "question of %d characters truncated to max_question_chars=%d", len(question), context.max_question_chars
        )
        question = question[: context.max_question_chars]
    protocol = PROTOCOLS[context.protocol]
    await asyncio.to_thread(getattr, context, "retriever")
    await asyncio.to_thread(protocol.load, context)
    return {
        "question": question,
        "truncated": truncated,
        "started_at": time.time(),
        **protocol.start(question, context),
    }


async def think(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """One model turn: an answer (→ finish), a search round (→ search ×k), or an invalid action (→ observe)."""
    context = runtime.context
    number = len(state.get("llm_calls", [])) + 1
    started = time.perf_counter()
    remaining = state["started_at"] + context.run_timeout_s - time.time()
    try:
        if remaining <= 0:
            raise TimeoutError(f"the run took longer than run_timeout_s={context.run_timeout_s:g}")
        thinking = PROTOCOLS[context.protocol].think(state, context, forced=number > context.max_turns)
        turn = await asyncio.wait_for(thinking, remaining)
    except Exception as exc:
        reason = f"run_timeout_s={context.run_timeout_s:g} reached" if isinstance(exc, TimeoutError) else ""
        raise AgentError(
            f"LLM call failed on turn {number}: {type(exc).__name__}: {reason or exc}",
            trajectory_of(state, context.mode, context.protocol),
            stats_of(state),
        ) from exc
    call = LLMCall(
        turn=number,
        prompt=turn.completion.prompt_text,
        completion=turn.completion.text,
        prompt_tokens=turn.completion.prompt_tokens,
        completion_tokens=turn.completion.completion_tokens,
        completion_ids=turn.completion.token_ids,
        logprobs=turn.completion.logprobs,
        finish_reason=turn.completion.finish_reason,
        action=turn.action,
        error=turn.error,
        latency_s=time.perf_counter() - started,
    )
    if turn.answer is not None:
        return {**turn.update, "llm_calls": [call], "answer": turn.answer}
    deadline = state["started_at"] + context.run_timeout_s
    return {**turn.update, "llm_calls": [call], "pending": _pending(turn, context, deadline)}


def _pending(turn: Turn, context: Context, deadline: float) -> PendingRound:
    """The round a turn asks for: each distinct non-empty sub-query once, at most ``max_parallel`` (one in
    sequential mode, where a message of several tool calls gets only its first searched)."""
    limit = 1 if context.mode == "sequential" else context.max_parallel
    capped = context.mode == "parallel" and len(turn.sub_queries) > limit
    return PendingRound(
        kind="search" if turn.action == "search" else "invalid",
        sub_queries=turn.sub_queries,
        searched=list(dict.fromkeys(q for q in turn.sub_queries[:limit] if q)),
        capped_from=len(turn.sub_queries) if capped else None,
        tool_call_ids=turn.tool_call_ids,
        started_at=time.perf_counter(),
        deadline=deadline,
    )


def route(state: AgentState) -> list[Send] | str:
    """After ``think``: finish on an answer, fan out one ``search`` per sub-query, or observe an invalid turn."""
    if state.get("answer") is not None:
        return "finish"
    pending = state["pending"]
    if pending["kind"] == "search" and pending["searched"]:
        tasks = enumerate(pending["searched"])
        return [Send("search", SearchTask(index=i, sub_query=q, deadline=pending["deadline"])) for i, q in tasks]
    return "observe"


async def search(task: SearchTask, runtime: Runtime[Context]) -> dict[str, Any]:
    """One sub-query on its own branch, so a round's searches run concurrently; a failure is recorded, not raised."""
    context = runtime.context
    outcome = await resilient_search(
        context.retriever,
        task["sub_query"],
        context.topk,
        timeout_s=context.search_timeout_s,
        retries=context.search_retries,
        backoff_s=context.search_backoff_s,
        rate_limit=context.search_rate_limit,
        backend=context.backend,
        deadline=task["deadline"],
    )
    if outcome.error:
        logger.warning("search for %r failed: %s", task["sub_query"], outcome.error)
    hit = SubQueryResult(
        index=task["index"],
        sub_query=task["sub_query"],
        passages=[{"id": p.id, "title": p.title, "score": p.score} for p in outcome.passages],
        texts=[(p.title, p.text) for p in outcome.passages],
        error=outcome.error,
        attempts=outcome.attempts,
        latency_s=outcome.latency_s,
    )
    return {"hits": [hit]}


async def observe(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """The round's results, in sub-query order, as the model reads them, and the round's record."""
    context = runtime.context
    protocol = PROTOCOLS[context.protocol]
    pending = state["pending"]
    if pending["kind"] == "invalid":
        return {**protocol.retry(), "pending": None}
    hits = sorted(state.get("hits", []), key=lambda h: h["index"])
    results = {h["sub_query"]: SubQueryObservation(h["sub_query"], h["texts"], h["error"]) for h in hits}
    record = SearchRound(
        round=len(state.get("search_rounds", [])) + 1,
        sub_queries=pending["sub_queries"],
        searched=pending["searched"],
        capped_from=pending["capped_from"],
        results=[{k: v for k, v in h.items() if k != "texts"} for h in hits],  # type: ignore[misc]
        latency_s=time.perf_counter() - pending["started_at"],
    )
    update = protocol.observation(pending, results, context)
    return {**update, "search_rounds": [record], "hits": None, "pending": None}


async def finish(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """The run's trajectory and stats, from the records alone."""
    context = runtime.context
    return {"trajectory": trajectory_of(state, context.mode, context.protocol), "stats": stats_of(state)}


# --- the wiring ---------------------------------------------------------------------------------


def _node(afunc: Callable[[Any, Runtime[Context]], Awaitable[dict[str, Any]]], defaults: Context) -> RunnableCallable:
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


def compile_graph(context_schema: type[Context] = Context, name: str = "parallel_search") -> Any:
    """The graph on ``context_schema``: ``Context`` (any spec, for trusted code) or a served graph's context,
    which takes only the names its operator allowed (``ps_agent.serving``)."""
    defaults = context_schema()
    builder = StateGraph(AgentState, context_schema=context_schema, input_schema=InputState, output_schema=OutputState)
    builder.add_node(_node(prepare, defaults))
    builder.add_node(_node(think, defaults))
    builder.add_node(_node(search, defaults), input_schema=SearchTask)
    builder.add_node(_node(observe, defaults))
    builder.add_node(_node(finish, defaults))
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "think")
    builder.add_conditional_edges("think", route, ["search", "observe", "finish"])
    builder.add_edge("search", "observe")
    builder.add_edge("observe", "think")
    builder.add_edge("finish", END)
    return builder.compile(name=name)


graph = compile_graph()


def graph_for(context: Context) -> Runnable[dict[str, Any], dict[str, Any]]:
    """``graph`` with ``context`` and its run limits bound: it runs alone or as a subgraph; a run's own
    ``context=`` replaces the bound one."""
    return graph.bind(context=context).with_config(context.limits)


def build_graph(llm: Any = None, retriever: Any = None, config: AgentConfig | None = None) -> Runnable:
    """``graph`` bound to ``config``'s settings on ``llm`` and ``retriever`` (objects or specs; ``config.llm`` and
    ``config.corpus`` win when set)."""
    settings = {f.name: getattr(config, f.name) for f in fields(config)} if config else {}
    given = {name: value for name, value in settings.items() if value is not None}
    return graph_for(Context(**{"llm": llm, "corpus": retriever} | given))
