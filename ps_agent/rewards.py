"""The paper's reward (arXiv 2508.09303, Eqs. 3–7): pure functions of a trajectory, and TRL reward functions.

r = r_o + r_d + r_s + r_f — outcome (exact match), decomposition, search count and format. Everything
is computed from the structured trajectory the agent records, never by re-parsing prompt + response.
``outcome_reward`` … ``format_reward`` are TRL reward functions: TRL calls them with the fields the rollout
function returns (``trajectory``, ``golden_answers``, ``question_type``; ``training/rollout.py``), which replace the
dataset's columns of the same names (dynamic sampling may have put another question in a group's place).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ps_agent import state
from ps_agent.metrics import exact_match
from ps_agent.protocol import is_well_formed_turn
from ps_agent.questions import class_shares, min_rounds, should_decompose, split_share

logger = logging.getLogger(__name__)

COMPONENTS = ("outcome", "decomposition", "search_count", "format")


@dataclass(frozen=True)
class RewardWeights:
    """λd, α, λs, λf of the paper, with its defaults."""

    decomposition: float = 0.15
    parallel_bonus: float = 3.0
    search_count: float = 0.35
    format: float = 0.1


DEFAULT_WEIGHTS = RewardWeights()


def forced(trajectory: Mapping[str, Any]) -> bool:
    """The environment pre-filled the answer after ``max_turns``: the policy never chose to answer."""
    return state.forced(trajectory["llm_calls"])


def format_valid(trajectory: Mapping[str, Any]) -> bool:
    """The response follows think → (search → information → think)* → answer, with every model turn
    well formed; a forced answer or an invalid turn makes it invalid. Under the tools protocol a turn is tool
    calls or a plain answer, which the chat API shapes: there is no tag to check."""
    calls = trajectory["llm_calls"]
    if not calls or calls[-1]["action"] != "answer":
        return False
    searches = calls[:-1]
    tags = trajectory.get("protocol", "tags") == "tags"
    return (
        all(call["action"] == "search" for call in searches)
        and len(trajectory["search_rounds"]) == len(searches)
        and (not tags or all(is_well_formed_turn(call["completion"]) for call in calls))
    )


def decomposed(trajectory: Mapping[str, Any]) -> bool:
    """Some search round split the question (``protocol.split_round``), as the agent's stats say."""
    return state.decomposed(trajectory["search_rounds"], trajectory["question"])


def outcome_component(trajectory: Mapping[str, Any], golden_answers: Sequence[str]) -> float:
    """r_o: exact match of the answer with any golden answer (SQuAD normalisation). A forced answer earns
    nothing: in training, an answer the environment had to ask for is not an answer."""
    if forced(trajectory):
        return 0.0
    return exact_match(trajectory.get("answer"), golden_answers)


def decomposition_component(trajectory: Mapping[str, Any], question_type: str | None, w: RewardWeights) -> float:
    """r_d: λd for not splitting a question that should stay whole, α·λd for splitting one that should be
    split (parallelisable and hybrid questions)."""
    split_wanted = should_decompose(question_type)
    split = decomposed(trajectory)
    if split_wanted and split:
        return w.parallel_bonus * w.decomposition
    if not split_wanted and not split:
        return w.decomposition
    return 0.0


def search_count_component(trajectory: Mapping[str, Any], question_type: str | None, w: RewardWeights) -> float:
    """r_s: one search round is ideal for parallelisable and single-hop questions, at least two for
    sequential and hybrid ones: the class's ``min_rounds``, the paper's rule, on purpose. A row's own hop count
    (``questions.rounds_needed``, 3 for a 3-hop chain) serves only the over- and under-search metrics."""
    n, need = len(trajectory["search_rounds"]), min_rounds(question_type)
    if need > 1:  # a chain: fewer rounds than it needs costs, more do not
        return -w.search_count * abs(min(n, need) - need)
    return -w.search_count * abs(n - 1)


def format_component(trajectory: Mapping[str, Any], outcome: float, w: RewardWeights) -> float:
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
    weights: RewardWeights = DEFAULT_WEIGHTS,
) -> dict[str, float]:
    """Each component and their sum under ``total`` (the trajectory log records them beside each rollout)."""
    outcome = outcome_component(trajectory, golden_answers)
    parts = {
        "outcome": outcome,
        "decomposition": decomposition_component(trajectory, question_type, weights),
        "search_count": search_count_component(trajectory, question_type, weights),
        "format": format_component(trajectory, outcome, weights),
    }
    return parts | {"total": sum(parts.values())}


# -- TRL reward functions: one per component, so TRL logs each as ``rewards/<name>/mean`` and sums them ----------


def outcome_reward(
    completions: list[Any], trajectory: list[Mapping[str, Any]], golden_answers: list[Sequence[str]], **kwargs: Any
) -> list[float]:
    """r_o of each rollout."""
    return [outcome_component(t, g) for t, g in zip(trajectory, golden_answers, strict=True)]


def decomposition_reward(
    completions: list[Any],
    trajectory: list[Mapping[str, Any]],
    question_type: list[str | None],
    weights: RewardWeights = DEFAULT_WEIGHTS,
    **kwargs: Any,
) -> list[float]:
    """r_d of each rollout."""
    return [decomposition_component(t, q, weights) for t, q in zip(trajectory, question_type, strict=True)]


def search_count_reward(
    completions: list[Any],
    trajectory: list[Mapping[str, Any]],
    question_type: list[str | None],
    weights: RewardWeights = DEFAULT_WEIGHTS,
    **kwargs: Any,
) -> list[float]:
    """r_s of each rollout."""
    return [search_count_component(t, q, weights) for t, q in zip(trajectory, question_type, strict=True)]


def format_reward(
    completions: list[Any],
    trajectory: list[Mapping[str, Any]],
    golden_answers: list[Sequence[str]],
    weights: RewardWeights = DEFAULT_WEIGHTS,
    **kwargs: Any,
) -> list[float]:
    """r_f of each rollout (it depends on whether the answer is right)."""
    return [
        format_component(t, outcome_component(t, g), weights) for t, g in zip(trajectory, golden_answers, strict=True)
    ]


def reward_functions(weights: RewardWeights = DEFAULT_WEIGHTS) -> list[Callable[..., list[float]]]:
    """The four TRL reward functions with these weights (``functools.partial``, which TRL names by the function)."""
    weighted = (decomposition_reward, search_count_reward, format_reward)
    return [outcome_reward, *(partial(f, weights=weights) for f in weighted)]


def always_decompose_optimal(class_fractions: Mapping[str, float], weights: RewardWeights = DEFAULT_WEIGHTS) -> bool:
    """Whether a policy that cannot tell the classes apart earns more r_d by always decomposing than by never
    decomposing, on a training mix with these class fractions.

    Always: α·λd·p, never: λd·(1 − p), with p the fraction that should be split (parallelisable + hybrid);
    always-decompose wins when α·p > 1 − p, i.e. p > 1 / (1 + α) (a quarter for the paper's α = 3).
    """
    p = split_share(class_fractions)
    return weights.parallel_bonus * weights.decomposition * p > weights.decomposition * (1 - p) + 1e-12


def choose_alpha(rows: Sequence[Mapping[str, Any]], alpha: float | None, paper_alpha: float = 3.0) -> float:
    """α for this training mix (question rows with a ``question_type``), logged with the class proportions.
    Always decomposing must never pay more decomposition reward than telling the classes apart: α·p < 1 − p,
    p the share of questions to split.
    ``None``: the paper's α, or 0.8 × the break-even (1 − p)/p where that is lower; an explicit α that
    breaks the rule is refused."""
    fractions = class_shares(r["question_type"] for r in rows)
    split = split_share(fractions)
    logger.info("training mix: %s", ", ".join(f"{c} {100 * f:.0f}%" for c, f in fractions.items()))
    break_even = (1 - split) / split if split else float("inf")
    if split >= 1:  # nothing to keep whole: always splitting is what telling the classes apart does
        logger.info("every question of this mix should be split: alpha = %.3g", paper_alpha if alpha is None else alpha)
        return paper_alpha if alpha is None else alpha
    if alpha is None:
        alpha = min(paper_alpha, 0.8 * break_even)
        logger.info("alpha = %.3g (break-even on this mix: %.3g)", alpha, break_even)
    elif always_decompose_optimal(fractions, RewardWeights(parallel_bonus=alpha)):
        raise ValueError(
            f"on this training mix {100 * split:.0f}% of the questions should be decomposed, so with alpha={alpha} "
            "always decomposing earns more decomposition reward than telling the classes apart: use --alpha "
            f"below {break_even:.2f}, or add sequential and single-hop questions"
        )
    return alpha
