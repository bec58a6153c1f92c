"""Typed graph state and the trajectory records it accumulates.

Records are plain ``TypedDict``s so that state, outputs and logs are JSON as they stand.
"""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, Literal, get_origin, get_type_hints

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from langgraph.types import Overwrite
from typing_extensions import TypedDict  # pydantic builds the served input and output schemas from it before 3.12

from ps_agent.protocol import split_round


class Segment(TypedDict):
    """A piece of the response after the prompt: model text, or environment text (observations)."""

    role: Literal["model", "env"]
    text: str
    token_ids: list[int] | None


class LLMCall(TypedDict):
    """One policy call: what it saw, what it wrote, and the action it took."""

    turn: int
    prompt: str
    completion: str
    prompt_tokens: int | None
    completion_tokens: int | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    action: Literal["search", "answer", "invalid", "forced_answer"]
    error: str | None
    latency_s: float


class PassageRef(TypedDict):
    id: str
    title: str
    score: float | None


class SubQueryResult(TypedDict):
    """What one parallel search branch returned."""

    index: int
    sub_query: str
    passages: list[PassageRef]
    texts: list[tuple[str, str]]
    error: str | None
    attempts: int
    latency_s: float


class SearchRound(TypedDict):
    """One search round: the sub-queries the model asked for and what each returned."""

    round: int
    sub_queries: list[str]
    searched: list[str]
    capped_from: int | None
    results: list[SubQueryResult]
    latency_s: float


class PendingRound(TypedDict):
    """The action of the latest turn, waiting for its observation."""

    kind: Literal["search", "invalid"]
    sub_queries: list[str]
    searched: list[str]
    capped_from: int | None
    tool_call_ids: list[str]
    call_errors: list[str | None]  # the tools protocol's: why each call was not searched (None: it was)
    round_started: float  # ``time.perf_counter()``, for the round's latency_s
    deadline: float  # the run's end (``time.time()``): the run's ``AgentState.started_at`` + run_timeout_s


class Stats(TypedDict):
    llm_calls: int
    search_rounds: int
    sub_queries: int
    decomposed: bool
    invalid_turns: int
    failed_searches: int
    forced_answer: bool
    question_truncated: bool  # the question was cut to max_question_chars before the model read it
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float


class Trajectory(TypedDict):
    question: str
    answer: str | None
    mode: str
    protocol: str
    prompt: str
    prompt_messages: list[dict[str, str]]
    response: str
    transcript: list[Segment]
    llm_calls: list[LLMCall]
    search_rounds: list[SearchRound]


def merge_hits(left: list[SubQueryResult], right: list[SubQueryResult] | None) -> list[SubQueryResult]:
    """Collect parallel search branches; ``None`` clears them once a round is observed."""
    return [] if right is None else left + right


class InputState(TypedDict):
    question: str


class OutputState(TypedDict):
    answer: str | None
    trajectory: Trajectory
    stats: Stats


class AgentState(InputState, OutputState, total=False):
    started_at: float
    prompt: str
    prompt_messages: list[dict[str, str]]
    truncated: bool
    transcript: Annotated[list[Segment], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]
    llm_calls: Annotated[list[LLMCall], operator.add]
    search_rounds: Annotated[list[SearchRound], operator.add]
    pending: PendingRound | None
    hits: Annotated[list[SubQueryResult], merge_hits]


ACCUMULATED = tuple(
    key for key, hint in get_type_hints(AgentState, include_extras=True).items() if get_origin(hint) is Annotated
)  # the keys whose reducers grow them: transcript, messages, llm_calls, search_rounds, hits


def fresh_run(state: AgentState, first: dict[str, Any]) -> dict[str, Any]:
    """A run's first update: ``first``, and on a thread that ran before (a checkpointer's, as under LangGraph
    Server and Studio) every key the last run left, reset: its answer would end this run and its turns would reach
    the model. The lists the reducers grow are replaced (``Overwrite`` bypasses their reducers)."""
    left = {key for key, value in state.items() if key != "question" and value not in (None, [])}
    update = {key: [] if key in (*ACCUMULATED, "prompt_messages") else None for key in left} | first
    return {key: Overwrite(value) if key in ACCUMULATED and key in left else value for key, value in update.items()}


class SearchTask(TypedDict):
    """The payload of one ``Send`` to the ``search`` node."""

    index: int
    sub_query: str
    deadline: float  # the run's end, as in PendingRound


def _total(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def decomposed(rounds: list[SearchRound], question: str) -> bool:
    """Some search round split the question (``protocol.split_round``): the stat, the reward and the metrics."""
    return any(split_round(r["searched"], question, first=i == 0) for i, r in enumerate(rounds))


def forced(calls: list[LLMCall]) -> bool:
    """The environment pre-filled the answer after ``max_turns``: the policy never chose to answer."""
    return any(c["action"] == "forced_answer" for c in calls)


def stats_of(state: AgentState) -> Stats:
    """Run statistics, derived from the trajectory records alone."""
    calls = state.get("llm_calls", [])
    rounds = state.get("search_rounds", [])
    return Stats(
        llm_calls=len(calls),
        search_rounds=len(rounds),
        sub_queries=sum(len(r["searched"]) for r in rounds),
        decomposed=decomposed(rounds, state.get("question", "")),
        invalid_turns=sum(c["action"] == "invalid" for c in calls),
        failed_searches=sum(res["error"] is not None for r in rounds for res in r["results"]),
        forced_answer=forced(calls),
        question_truncated=state.get("truncated", False),
        prompt_tokens=_total([c["prompt_tokens"] for c in calls]),
        completion_tokens=_total([c["completion_tokens"] for c in calls]),
        latency_s=time.time() - state["started_at"] if "started_at" in state else 0.0,
    )


def trajectory_of(state: AgentState, mode: str, protocol: str) -> Trajectory:
    """The inspectable record of a run: prompt, response text, every LLM call and search round."""
    return Trajectory(
        question=state.get("question", ""),
        answer=state.get("answer"),
        mode=mode,
        protocol=protocol,
        prompt=state.get("prompt", ""),
        prompt_messages=state.get("prompt_messages", []),
        response="".join(segment["text"] for segment in state.get("transcript", [])),
        transcript=state.get("transcript", []),
        llm_calls=state.get("llm_calls", []),
        search_rounds=state.get("search_rounds", []),
    )
