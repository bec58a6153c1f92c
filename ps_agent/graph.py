"""build_graph(): the think → search ×k → observe → … → finish state machine.

START → prepare → think ─┬─ search ×k (one Send per distinct sub-query, in parallel) → observe → think
                         ├─ observe (invalid action: Search-R1's message) → think
                         └─ finish (an answer, or the forced answer after max_turns) → END
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, get_buffer_string
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

from ps_agent.configuration import AgentConfig
from ps_agent.llms import Completion, resolve_chat_model, resolve_text_policy, token_cap
from ps_agent.protocol import (
    FORCED_ANSWER_PROMPT,
    INVALID_ACTION_MESSAGE,
    STOP_SEQUENCES,
    TOOLS_PARALLEL_HINT,
    TOOLS_PROMPT,
    TOOLS_SEQUENTIAL_HINT,
    SubQueryObservation,
    parse_action,
    parse_forced_answer,
    render_chat_prompt,
    render_information,
    render_prompt,
)
from ps_agent.retrieval import resilient_search, resolve_retriever
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


def _node(afunc: Callable[..., Awaitable[dict[str, Any]]]) -> RunnableLambda:
    """An async node that also runs under the graph's sync ``invoke``/``stream`` (on the shared loop)."""

    def func(state: Any, config: RunnableConfig) -> dict[str, Any]:
        return run_sync(afunc(state, config))

    return RunnableLambda(func, afunc=afunc, name=afunc.__name__)


def _distinct(queries: list[str]) -> list[str]:
    return list(dict.fromkeys(queries))


def _env(text: str) -> Segment:
    return {"role": "env", "text": text, "token_ids": None}


def build_graph(llm: Any = None, retriever: Any = None, config: AgentConfig | None = None) -> CompiledStateGraph:
    """Compile the agent graph. ``llm``/``retriever`` are objects or specs; ``configurable`` overrides them."""
    defaults = config or AgentConfig()

    def settings(runnable_config: RunnableConfig | None) -> AgentConfig:
        return defaults.with_overrides(runnable_config)

    def llm_spec(cfg: AgentConfig) -> Any:
        return cfg.llm if cfg.llm is not None else llm

    def search_backend(cfg: AgentConfig) -> Any:
        return resolve_retriever(cfg.corpus if cfg.corpus is not None else retriever)

    async def prepare(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        cfg = settings(config)
        question = state.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question is empty: expected a non-empty string, got {question!r}")
        try:
            question.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"question is not valid text: {exc.object[exc.start : exc.end]!a} at character {exc.start} "
                "(a lone surrogate, e.g. undecodable bytes); expected UTF-8 text"
            ) from None
        question = question.strip()
        truncated = len(question) > cfg.max_question_chars
        if truncated:
            logger.warning(
                "question of %d characters truncated to max_question_chars=%d", len(question), cfg.max_question_chars
            )
            question = question[: cfg.max_question_chars]
        # fail fast on a missing corpus or model, and load both before the first turn (off the event loop)
        await asyncio.to_thread(search_backend, cfg)
        update: dict[str, Any] = {"question": question, "truncated": truncated, "started_at": time.time()}
        if cfg.protocol == "tools":
            await asyncio.to_thread(resolve_chat_model, llm_spec(cfg))
            hint = TOOLS_PARALLEL_HINT if cfg.mode == "parallel" else TOOLS_SEQUENTIAL_HINT
            update["prompt"] = TOOLS_PROMPT.format(parallel_hint=hint, question=question)
            update["messages"] = [HumanMessage(update["prompt"])]
        else:
            await asyncio.to_thread(resolve_text_policy, llm_spec(cfg), cfg.mode)
            update["prompt"] = render_prompt(question, cfg.mode)
            update["prompt_messages"] = render_chat_prompt(question, cfg.mode, cfg.demonstration)
        return update

    async def think(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        cfg = settings(config)
        turn = len(state.get("llm_calls", []))
        forced = turn >= cfg.max_turns
        started = time.perf_counter()
        try:
            if cfg.protocol == "tools":
                update = await _think_tools(state, cfg, forced)
            else:
                update = await _think_tags(state, cfg, forced)
        except Exception as exc:
            raise AgentError(
                f"LLM call failed on turn {turn + 1}: {type(exc).__name__}: {exc}",
                trajectory_of(state, cfg.mode, cfg.protocol),
                stats_of(state),
            ) from exc
        update["llm_calls"][0].update(turn=turn + 1, latency_s=time.perf_counter() - started)
        return update

    async def _think_tags(state: AgentState, cfg: AgentConfig, forced: bool) -> dict[str, Any]:
        policy = resolve_text_policy(llm_spec(cfg), cfg.mode)
        new: list[Segment] = [_env(FORCED_ANSWER_PROMPT)] if forced else []
        transcript = state.get("transcript", []) + new
        stop = ["</answer>"] if forced else list(STOP_SEQUENCES)
        completion = await policy.acomplete(
            state["prompt_messages"], transcript, stop=stop, max_tokens=cfg.max_new_tokens
        )
        new.append({"role": "model", "text": completion.text, "token_ids": completion.token_ids})
        update: dict[str, Any] = {"transcript": new}
        if forced:
            update["answer"] = parse_forced_answer(completion.text)
            update["llm_calls"] = [_llm_call(completion, "forced_answer", None)]
            return update
        action = parse_action(completion.text, cfg.mode)
        update["llm_calls"] = [_llm_call(completion, action.kind, action.error)]
        if action.kind == "answer":
            update["answer"] = action.content
        else:
            update["pending"] = _pending(cfg, action.kind, list(action.sub_queries), [])
        return update

    async def _think_tools(state: AgentState, cfg: AgentConfig, forced: bool) -> dict[str, Any]:
        model = resolve_chat_model(llm_spec(cfg))
        messages = list(state["messages"])
        new = [HumanMessage(TOOLS_FORCED_MESSAGE)] if forced else []
        runnable = model if forced else model.bind_tools([SEARCH_TOOL])
        reply: AIMessage = await runnable.ainvoke(messages + new, **token_cap(model, cfg.max_new_tokens))
        new.append(reply)
        usage = reply.usage_metadata or {}
        completion = Completion(
            text=reply.text + "".join(json.dumps(c["args"]) for c in reply.tool_calls),
            prompt_text=get_buffer_string(messages),
            prompt_tokens=usage.get("input_tokens"),
            completion_tokens=usage.get("output_tokens"),
            finish_reason=reply.response_metadata.get("finish_reason"),
        )
        update: dict[str, Any] = {"messages": new}
        if reply.tool_calls and not forced:
            queries = [str(call["args"].get("query", "")).strip() for call in reply.tool_calls]
            update["pending"] = _pending(cfg, "search", queries, [call["id"] for call in reply.tool_calls])
            update["llm_calls"] = [_llm_call(completion, "search", None)]
        elif reply.text.strip():
            update["answer"] = parse_forced_answer(reply.text)
            update["llm_calls"] = [_llm_call(completion, "forced_answer" if forced else "answer", None)]
        elif forced:
            update["answer"] = ""
            update["llm_calls"] = [_llm_call(completion, "forced_answer", "empty final answer")]
        else:
            update["pending"] = _pending(cfg, "invalid", [], [])
            update["llm_calls"] = [_llm_call(completion, "invalid", "no tool call and no answer")]
        return update

    def route(state: AgentState) -> list[Send] | str:
        if state.get("answer") is not None:
            return "finish"
        pending = state["pending"]
        if pending["kind"] == "search" and pending["searched"]:
            return [Send("search", SearchTask(index=i, sub_query=q)) for i, q in enumerate(pending["searched"])]
        return "observe"

    async def search(task: SearchTask, config: RunnableConfig) -> dict[str, Any]:
        cfg = settings(config)
        outcome = await resilient_search(
            search_backend(cfg),
            task["sub_query"],
            cfg.topk,
            timeout_s=cfg.search_timeout_s,
            retries=cfg.search_retries,
            backoff_s=cfg.search_backoff_s,
            rate_limit=cfg.search_rate_limit,
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

    async def observe(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        cfg = settings(config)
        pending = state["pending"]
        if pending["kind"] == "invalid":
            if cfg.protocol == "tools":
                return {"messages": [HumanMessage(TOOLS_INVALID_MESSAGE)], "pending": None}
            return {"transcript": [_env(INVALID_ACTION_MESSAGE)], "pending": None}
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
        update: dict[str, Any] = {"search_rounds": [record], "hits": None, "pending": None}
        if cfg.protocol == "tools":
            update["messages"] = [
                ToolMessage(_tool_observation(cfg, pending, query, results), tool_call_id=call_id)
                for query, call_id in zip(pending["sub_queries"], pending["tool_call_ids"], strict=True)
            ]
            return update
        note = None
        if pending["capped_from"]:
            note = (
                f"Only the first {cfg.max_parallel} of {pending['capped_from']} sub-queries were searched "
                f"(max_parallel={cfg.max_parallel})."
            )
        update["transcript"] = [_env(render_information(list(results.values()), note))]
        return update

    async def finish(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        cfg = settings(config)
        return {"trajectory": trajectory_of(state, cfg.mode, cfg.protocol), "stats": stats_of(state)}

    builder = StateGraph(AgentState, input_schema=InputState, output_schema=OutputState)
    builder.add_node("prepare", _node(prepare))
    builder.add_node("think", _node(think))
    builder.add_node("search", _node(search), input_schema=SearchTask)
    builder.add_node("observe", _node(observe))
    builder.add_node("finish", _node(finish))
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "think")
    builder.add_conditional_edges("think", route, ["search", "observe", "finish"])
    builder.add_edge("search", "observe")
    builder.add_edge("observe", "think")
    builder.add_edge("finish", END)
    return builder.compile(name="parallel_search")


def _llm_call(completion: Completion, action: str, error: str | None) -> LLMCall:
    return LLMCall(
        turn=0,
        prompt=completion.prompt_text,
        completion=completion.text,
        prompt_tokens=completion.prompt_tokens,
        completion_tokens=completion.completion_tokens,
        completion_ids=completion.token_ids,
        logprobs=completion.logprobs,
        finish_reason=completion.finish_reason,
        action=action,  # type: ignore[typeddict-item]
        error=error,
        latency_s=0.0,
    )


def _pending(cfg: AgentConfig, kind: str, sub_queries: list[str], tool_call_ids: list[str]) -> PendingRound:
    """The round an action asks for: at most ``max_parallel`` sub-queries (one in sequential
    tool calling), each distinct non-empty query searched once."""
    limit = 1 if cfg.protocol == "tools" and cfg.mode == "sequential" else cfg.max_parallel
    capped = len(sub_queries) > limit
    return PendingRound(
        kind=kind,  # type: ignore[typeddict-item]
        sub_queries=sub_queries,
        searched=_distinct([q for q in sub_queries[:limit] if q]),
        capped_from=len(sub_queries) if capped and cfg.mode == "parallel" else None,
        tool_call_ids=tool_call_ids,
        started_at=time.perf_counter(),
    )


def _tool_observation(
    cfg: AgentConfig, pending: PendingRound, query: str, results: dict[str, SubQueryObservation]
) -> str:
    """The tool message for one tool call of a round."""
    if not query:
        return "Search failed: empty query."
    if query not in results:
        if cfg.mode == "sequential":
            return "Not searched: one search per turn in sequential mode."
        return f"Not searched: at most {cfg.max_parallel} searches per round (max_parallel)."
    return render_information([results[query]]).strip()
