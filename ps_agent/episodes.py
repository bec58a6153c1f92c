"""One episode, one record: the line an eval's results file and a GRPO run's trajectory log both hold, the shape
``report.py`` draws, and the two summaries of such lines, both over ``metrics.behaviour``: ``aggregate`` (eval and
the benchmarks' tables, shares in percent) and ``summarise_rollouts`` (a training run's log, per step or whole,
shares as fractions, with GRPO's groups and the collapse signals).

A record is the question (``question_fields``), then what the agent did with it: its answer, the metrics against
the golden answers, the reward components, the counts of the agent's ``stats``, and the ``timeline`` a page draws.
An eval line adds its ``dataset`` and ``mode``; a rollout line its ``step`` and whether it was ``truncated``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from ps_agent.metrics import behaviour, cover_exact_match, exact_match, f1_score, mean, search_need, think_words
from ps_agent.questions import question_class, rounds_needed
from ps_agent.rewards import COMPONENTS, DEFAULT_WEIGHTS, RewardWeights, format_valid, reward_components

#: the counts of the agent's ``stats`` a record keeps
STATS = ("llm_calls", "search_rounds", "decomposed", "forced_answer", "failed_searches", "latency_s")


def question_fields(row: dict[str, Any]) -> dict[str, Any]:
    """What every record says of its question (a row of ``questions.to_row``)."""
    return {
        "id": row.get("id"),
        "question": row["question"],
        "question_type": row["question_type"],
        "question_class": question_class(row["question_type"]),
        "golden_answers": row["golden_answers"],
        "rounds_needed": rounds_needed(row),
    }


def timeline_of(trajectory: dict[str, Any]) -> dict[str, Any]:
    """The part of a trajectory a report draws: each turn's text and action, and each search round's
    sub-queries with the titles and scores each found (passage texts stay in the corpus)."""
    return {
        "turns": [
            {k: call[k] for k in ("turn", "action", "completion", "completion_tokens", "finish_reason", "latency_s")}
            for call in trajectory["llm_calls"]
        ],
        "search_rounds": [
            {
                "sub_queries": r["sub_queries"],
                "latency_s": r["latency_s"],
                "results": [{k: x[k] for k in ("sub_query", "passages", "error", "latency_s")} for x in r["results"]],
            }
            for r in trajectory["search_rounds"]
        ],
    }


def episode_record(
    row: dict[str, Any], out: dict[str, Any], weights: RewardWeights = DEFAULT_WEIGHTS
) -> dict[str, Any]:
    """One episode the agent ran (``out``: its ``answer``, ``trajectory`` and ``stats``) on the question ``row``:
    answer, metrics, reward components (under ``weights``), turns, searches, latency and timeline."""
    trajectory, stats = out["trajectory"], out["stats"]
    answer, golden = out["answer"], row["golden_answers"]
    return question_fields(row) | {
        "answer": answer,
        **scores(answer, golden),
        "rewards": reward_components(trajectory, golden, row["question_type"], weights),
        "format_valid": format_valid(trajectory),
        "sub_queries_per_round": [len(r["searched"]) for r in trajectory["search_rounds"]],
        **{key: stats[key] for key in STATS},
        "error": None,
        "timeline": timeline_of(trajectory),
    }


def scores(answer: str | None, golden_answers: Sequence[str]) -> dict[str, float]:
    """An answer's EM, F1 and cover-EM against the golden answers."""
    return {
        "em": exact_match(answer, golden_answers),
        "f1": f1_score(answer, golden_answers),
        "cover_em": cover_exact_match(answer, golden_answers),
    }


def error_record(row: dict[str, Any], exc: BaseException, latency_s: float) -> dict[str, Any]:
    """A question whose run failed (LLM or retriever): counted in the report, with its reason."""
    return question_fields(row) | {"answer": None, "latency_s": latency_s, "error": f"{type(exc).__name__}: {exc}"}


def interval(statistics: np.ndarray) -> list[float]:
    """The 95% percentile bootstrap interval of a statistic computed on each resample."""
    return [float(np.percentile(statistics, 2.5)), float(np.percentile(statistics, 97.5))]


def scored(record: dict[str, Any], metric: str) -> float:
    """``record``'s ``em``, ``f1`` or ``cover_em``: 0 for a question whose run errored, which has no answer."""
    return 0.0 if record["error"] is not None else float(record[metric])


def question_key(record: dict[str, Any]) -> tuple[str, str]:
    """A result line's question, as results are ordered for resampling: its dataset and id."""
    return str(record.get("dataset", "")), str(record.get("id", ""))


def aggregate(
    records: Sequence[dict[str, Any]], bootstrap: int = 0, rng: np.random.Generator | None = None
) -> dict[str, Any]:
    """Means in percent where they are shares, and the count of records that errored. An errored question has no
    answer, so it scores 0 in EM, F1 and cover-EM (a run cannot gain by failing on hard questions); what the agent
    did (decomposition, turns, seconds, …) is averaged over the records that ran. ``bootstrap``: that many
    resamples of the questions (``rng``, default seeded 0) give 95% intervals on EM and on turns (``em_ci``,
    ``turns_ci``)."""
    records = sorted(records, key=question_key)  # the resamples do not depend on the order runs finished in
    ok = [r for r in records if r["error"] is None]
    summary: dict[str, Any] = {"n": len(records), "errors": len(records) - len(ok)}
    if not ok:  # every run failed: each scores 0, and there is no behaviour to average
        zero = {"em_ci": [0.0, 0.0]} if bootstrap and records else {}
        return summary | ({"em": 0.0, "f1": 0.0, "cover_em": 0.0} | zero if records else {})
    seen = behaviour(ok)
    em = np.array([100.0 * scored(r, "em") for r in records])
    turns = np.array([float(r["llm_calls"]) for r in ok])
    summary |= {
        "em": float(em.mean()),
        "f1": 100 * mean([scored(r, "f1") for r in records]),
        "cover_em": 100 * mean([scored(r, "cover_em") for r in records]),
        "decomposition_ratio": 100 * seen["decomposed"],
        "format_valid": 100 * seen["format_valid"],
        "forced_answer": 100 * seen["forced_answer"],
        "seconds_per_question": mean([r["latency_s"] for r in ok]),
        "turns": float(turns.mean()),
        "search_rounds": seen["search_rounds"],
        "two_rounds": 100 * mean([float(r["search_rounds"] >= 2) for r in ok]),
        "reward": mean([r["rewards"]["total"] for r in ok]),
    }
    if bootstrap:
        rng = rng if rng is not None else np.random.default_rng(0)
        questions = rng.integers(0, len(records), size=(bootstrap, len(records)))
        ran = rng.integers(0, len(ok), size=(bootstrap, len(ok))) if len(ok) < len(records) else questions
        summary |= {"em_ci": interval(em[questions].mean(axis=1)), "turns_ci": interval(turns[ran].mean(axis=1))}
    return summary


def grpo_groups(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rollouts grouped as GRPO compares them: one step's rollouts of one question."""
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["step"], r.get("question")), []).append(r)
    return list(groups.values())


def split_advantage(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What splitting earned, by question class: over the GRPO groups holding both split and whole rollouts,
    the mean reward of the split ones minus that of the whole ones (total, and its outcome part). Its sign is
    where GRPO pushes the policy: below zero on parallelisable questions, it is learning to stop splitting them
    (e.g. a comparison answered as often by naming an entity of the question as by searching them all)."""
    diffs: dict[str, dict[str, list[float]]] = {}
    for group in grpo_groups(records):
        split = [r["rewards"] for r in group if r["decomposed"]]
        whole = [r["rewards"] for r in group if not r["decomposed"]]
        if split and whole:
            d = diffs.setdefault(group[0]["question_class"], {"total": [], "outcome": []})
            for k, values in d.items():
                values.append(mean([x[k] for x in split]) - mean([x[k] for x in whole]))
    return {c: {"groups": len(d["total"])} | {k: mean(v) for k, v in d.items()} for c, d in sorted(diffs.items())}


def summarise_rollouts(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals of a trajectory log: reward components, and format, forced answers, search rounds and
    decomposition by class (``metrics.behaviour``), and the collapse signals: over- and under-search
    (``metrics.search_need``), think length, groups with nothing to teach, the class mix and what splitting
    earned."""
    if not records:
        return {"rollouts": 0}
    sized = [[r["rewards"]["total"] for r in g] for g in grpo_groups(records) if len(g) > 1]
    classes = Counter(r["question_class"] for r in records)
    return {
        "rollouts": len(records),
        "steps": len({r["step"] for r in records}),
        "rewards": {k: mean([r["rewards"][k] for r in records]) for k in (*COMPONENTS, "total")},
        **behaviour(records),
        **search_need(records),
        "think_words": think_words(records),
        # groups whose rewards are all equal teach nothing; the mix of classes trained on
        "zero_std_groups": mean([float(max(t) - min(t) < 1e-9) for t in sized]),
        "class_mix": {c: n / len(records) for c, n in sorted(classes.items())},
        "split_advantage": split_advantage(records),
    }
