"""The paper's reward (arXiv 2508.09303, Eqs. 3–7): pure functions of a trajectory.

r = r_o + r_d + r_s + r_f — outcome (exact match), decomposition, search count and format. Everything
is computed from the structured trajectory the agent records, never by re-parsing prompt + response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ps_agent.metrics import exact_match
from ps_agent.protocol import is_well_formed_turn

QuestionClass = Literal["parallelisable", "sequential", "single-hop"]
COMPONENTS = ("outcome", "decomposition", "search_count", "format")


@dataclass(frozen=True)
class RewardWeights:
    """λd, α, λs, λf of the paper, with its defaults."""

    decomposition: float = 0.15
    parallel_bonus: float = 3.0
    search_count: float = 0.35
    format: float = 0.1


def question_class(question_type: str | None) -> QuestionClass:
    """The paper's classes from a dataset ``type``: comparison → parallelisable, none → single-hop,
    anything else (bridge, compositional, inference, 2hop, …) → sequential."""
    if not question_type:
        return "single-hop"
    return "parallelisable" if question_type == "comparison" else "sequential"


def format_valid(trajectory: Mapping[str, Any]) -> bool:
    """The response follows think → (search → information → think)* → answer, with every model turn
    well formed; a forced answer or an invalid turn makes it invalid."""
    calls = trajectory["llm_calls"]
    if not calls or calls[-1]["action"] != "answer":
        return False
    searches = calls[:-1]
    return (
        all(call["action"] == "search" for call in searches)
        and len(trajectory["search_rounds"]) == len(searches)
        and all(is_well_formed_turn(call["completion"]) for call in calls)
    )


def decomposed(trajectory: Mapping[str, Any]) -> bool:
    """Some search round had more than one distinct sub-query."""
    return any(len(r["searched"]) > 1 for r in trajectory["search_rounds"])


def outcome_reward(trajectory: Mapping[str, Any], golden_answers: Sequence[str]) -> float:
    """r_o: exact match of the answer with any golden answer (SQuAD normalisation)."""
    return exact_match(trajectory.get("answer"), golden_answers)


def decomposition_reward(trajectory: Mapping[str, Any], question_type: str | None, w: RewardWeights) -> float:
    """r_d: λd for not splitting a question that is not parallelisable, α·λd for splitting one that is."""
    parallelisable = question_class(question_type) == "parallelisable"
    split = decomposed(trajectory)
    if parallelisable and split:
        return w.parallel_bonus * w.decomposition
    if not parallelisable and not split:
        return w.decomposition
    return 0.0


def search_count_reward(trajectory: Mapping[str, Any], question_type: str | None, w: RewardWeights) -> float:
    """r_s: one search round is ideal for parallelisable and single-hop questions, two for sequential ones."""
    n = len(trajectory["search_rounds"])
    if question_class(question_type) == "sequential":
        return -w.search_count * abs(min(n, 2) - 2)
    return -w.search_count * abs(n - 1)


def format_reward(trajectory: Mapping[str, Any], outcome: float, w: RewardWeights) -> float:
    """r_f: −λf for a right answer in an invalid format, +λf for a wrong answer in a valid one."""
    valid = format_valid(trajectory)
    if outcome > 0 and not valid:
        return -w.format
    if outcome == 0 and valid:
        return w.format
    return 0.0


def reward_components(
    trajectory: Mapping[str, Any],
    golden_answers: Sequence[str],
    question_type: str | None,
    weights: RewardWeights | None = None,
) -> dict[str, float]:
    """Each component and their sum under ``total``."""
    w = weights or RewardWeights()
    outcome = outcome_reward(trajectory, golden_answers)
    parts = {
        "outcome": outcome,
        "decomposition": decomposition_reward(trajectory, question_type, w),
        "search_count": search_count_reward(trajectory, question_type, w),
        "format": format_reward(trajectory, outcome, w),
    }
    return parts | {"total": sum(parts.values())}
