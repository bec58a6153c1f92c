"""The agent's graph: module-level nodes that read ``runtime.context`` (a ``Context``), then the wiring.

START → prepare → think ─┬─ search ×k (one Send per distinct sub-query, in parallel) → observe → think
                         ├─ observe (invalid action: the protocol's retry message) → think
                         └─ finish (an answer, or the forced answer after max_turns) → END

``think`` speaks the policy protocol the context names: ``tags`` (Search-R1's text, ``<search> a ## b </search>``,
token-exact) or ``tools`` (native tool calling: the ``search`` calls of one message are one round).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from langchain_core.runnables import Runnable
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send

from ps_agent.context import Context
from ps_agent.policy_protocols import PROTOCOLS, Turn
from ps_agent.protocol import SubQueryObservation, distinct_sub_queries
from ps_agent.retrieval import resilient_search
from ps_agent.runner import graph_node
from ps_agent.state import (
    AgentState,
    InputState,
    LLMCall,
    OutputState,
    PendingRound,
    SearchRound,
    SearchTask,
    SubQueryResult,
    fresh_run,
    stats_of,
    trajectory_of,
)
from ps_agent.text import lone_surrogates

logger = logging.getLogger(__name__)


class AgentError(RuntimeError):
    """An LLM failure during a run; carries the partial trajectory and stats up to that point."""

    def __init__(self, message: str, trajectory: dict[str, Any], stats: dict[str, Any]) -> None:
        super().__init__(message)
        self.trajectory = trajectory
        self.stats = stats

    def __reduce__(self) -> tuple[type[AgentError], tuple[str, dict[str, Any], dict[str, Any]]]:
        return type(self), (str(self), self.trajectory, self.stats)  # pickled whole: across processes, as batch runs


# --- the nodes ----------------------------------------------------------------------------------


async def prepare(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """Check the question and load the model and retriever (off the event loop, failing fast) before turn one; the
    state starts afresh, even on a thread that ran before."""
    context = runtime.context
    question = state.get("question")
    if question is None:
        raise ValueError("the input has no 'question': expected {'question': str}")
    if not isinstance(question, str):
        raise ValueError(f"question must be a string, got {type(question).__name__}: {question!r:.80}")
    if not question.strip():
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
    policy_protocol = PROTOCOLS[context.protocol]
    await asyncio.to_thread(getattr, context, "retriever")
    await asyncio.to_thread(policy_protocol.load, context)
    return fresh_run(
        state,
        {"question": question, "truncated": truncated, "started_at": time.time()}
        | policy_protocol.start(question, context),
    )


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
        timed_out = isinstance(exc, TimeoutError)
        reason = f"run_timeout_s={context.run_timeout_s:g} reached" if timed_out else context.failure("llm", str(exc))
        raise AgentError(
            f"LLM call failed on turn {number}: {type(exc).__name__}: {reason}",
            trajectory_of(state, context.mode, context.protocol),
            stats_of(state),
        ) from exc
    pending = _pending(turn, context, state["started_at"] + context.run_timeout_s) if turn.answer is None else None
    action, error = turn.action, turn.error
    if pending and pending["kind"] == "search" and not pending["searched"]:  # read back, but not a search round
        refused = "; ".join(dict.fromkeys(why for why in pending["call_errors"] if why))  # a tool call's reasons
        action, error = "invalid", refused or "no sub-query has a word to search for"
    call = LLMCall(
        turn=number,
        prompt=turn.completion.prompt_text,
        completion=turn.completion.text,
        prompt_tokens=turn.completion.prompt_tokens,
        completion_tokens=turn.completion.completion_tokens,
        completion_ids=turn.completion.token_ids,
        logprobs=turn.completion.logprobs,
        finish_reason=turn.completion.finish_reason,
        action=action,
        error=error,
        latency_s=time.perf_counter() - started,
    )
    if pending is None:
        return {**turn.update, "llm_calls": [call], "answer": turn.answer}
    return {**turn.update, "llm_calls": [call], "pending": pending}


def _pending(turn: Turn, context: Context, deadline: float) -> PendingRound:
    """The round a turn asks for: the first ``max_parallel`` of its distinct sub-queries (``distinct_sub_queries``;
    one in sequential mode, where a message of several tool calls gets only its first searched)."""
    limit = 1 if context.mode == "sequential" else context.max_parallel
    distinct = distinct_sub_queries(turn.sub_queries)
    capped = context.mode == "parallel" and len(distinct) > limit
    return PendingRound(
        kind="search" if turn.action == "search" else "invalid",
        sub_queries=turn.sub_queries,
        searched=distinct[:limit],
        capped_from=len(distinct) if capped else None,
        tool_call_ids=turn.tool_call_ids,
        call_errors=turn.call_errors or [None] * len(turn.tool_call_ids),
        round_started=time.perf_counter(),
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
    """One sub-query on its own branch, so a round's searches run concurrently; a failure is recorded, not raised.
    A task a client sent itself (a served graph's ``command``) is checked, and searched at most
    ``max_question_chars`` long, as a question is."""
    context = runtime.context
    if not (isinstance(task, dict) and isinstance(task.get("index"), int) and isinstance(task.get("sub_query"), str)):
        raise ValueError(f"a search task is {{'index': int, 'sub_query': str, 'deadline': float}}, got {task!r:.120}")
    outcome = await resilient_search(
        context.retriever,
        task["sub_query"][: context.max_question_chars],
        context.topk,
        timeout_s=context.search_timeout_s,
        retries=context.search_retries,
        backoff_s=context.search_backoff_s,
        rate_limit=context.search_rate_limit,
        backend=context.backend,
        deadline=min(task.get("deadline", math.inf), time.time() + context.run_timeout_s),  # a Send a client made too
    )
    error = outcome.error and context.failure("corpus", outcome.error)  # what the model and the client read
    if outcome.error:
        logger.warning("search for %r failed: %s", task["sub_query"], outcome.error)
    hit = SubQueryResult(
        index=task["index"],
        sub_query=task["sub_query"],
        passages=[{"id": p.id, "title": p.title, "score": p.score} for p in outcome.passages],
        texts=[(p.title, p.text) for p in outcome.passages],
        error=error,
        attempts=outcome.attempts,
        latency_s=outcome.latency_s,
    )
    return {"hits": [hit]}


async def observe(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """The round's results, in sub-query order, as the model reads them, and the round's record."""
    context = runtime.context
    policy_protocol = PROTOCOLS[context.protocol]
    pending = state["pending"]
    if pending["kind"] == "invalid":
        return {**policy_protocol.retry(), "pending": None}
    hits = sorted(state.get("hits", []), key=lambda h: h["index"])
    results = {h["sub_query"]: SubQueryObservation(h["sub_query"], h["texts"], h["error"]) for h in hits}
    update = policy_protocol.observation(pending, results, context)
    if not pending["searched"]:  # the model is told why nothing was searched; no round was searched
        return {**update, "hits": None, "pending": None}
    record = SearchRound(
        round=len(state.get("search_rounds", [])) + 1,
        sub_queries=pending["sub_queries"],
        searched=pending["searched"],
        capped_from=pending["capped_from"],
        results=[{k: v for k, v in h.items() if k != "texts"} for h in hits],  # type: ignore[misc]
        latency_s=time.perf_counter() - pending["round_started"],
    )
    return {**update, "search_rounds": [record], "hits": None, "pending": None}


async def finish(state: AgentState, runtime: Runtime[Context]) -> dict[str, Any]:
    """The run's trajectory and stats, from the records alone."""
    context = runtime.context
    return {"trajectory": trajectory_of(state, context.mode, context.protocol), "stats": stats_of(state)}


# --- the wiring ---------------------------------------------------------------------------------


def compile_graph(context_schema: type[Context] = Context, name: str = "parallel_search") -> Any:
    """The graph on ``context_schema``: ``Context`` (any spec, for trusted code) or a served graph's context,
    which takes only the names its operator allowed (``ps_agent.serving``)."""
    defaults = context_schema()
    builder = StateGraph(AgentState, context_schema=context_schema, input_schema=InputState, output_schema=OutputState)
    builder.add_node(graph_node(prepare, defaults))
    builder.add_node(graph_node(think, defaults))
    builder.add_node(graph_node(search, defaults), input_schema=SearchTask)
    builder.add_node(graph_node(observe, defaults))
    builder.add_node(graph_node(finish, defaults))
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
