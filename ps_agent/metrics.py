"""Answer metrics with SQuAD normalisation (exact match, F1, cover exact match), and the aggregation of how a
group of episodes behaved (format, forced answers, decomposition by question class, over- and under-search,
think length)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _key(text: str) -> str:
    """What answers are compared by: the normalised text, or, where normalisation empties it (NQ's gold "A+",
    "---"), the text lower-cased with single spaces and without the sentence's punctuation around it, so that it
    can still be matched by the same answer."""
    return normalize_answer(text) or " ".join(text.lower().split()).strip(".,;:!?\"'")  # "A+." is "A+"


def _golds(golden_answers: Sequence[str]) -> list[str]:
    """The golden answers' keys, less empty ones: an empty answer must match nothing (it earned the reward)."""
    return [gold for gold in map(_key, golden_answers) if gold]


def exact_match(prediction: str | None, golden_answers: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer (an empty one matches none)."""
    if prediction is None:
        return 0.0
    return float(_key(prediction) in _golds(golden_answers))


def cover_exact_match(prediction: str | None, golden_answers: Sequence[str]) -> float:
    """1.0 if any normalised golden answer appears, as whole words, in the normalised prediction."""
    if prediction is None:
        return 0.0
    guess = f" {_key(prediction)} "
    return float(any(f" {gold} " in guess for gold in _golds(golden_answers)))


_YES_NO = ("yes", "no", "noanswer")


def f1_score(prediction: str | None, golden_answers: Sequence[str]) -> float:
    """The best token-level F1 over the golden answers; as in HotpotQA's official script, a yes/no answer or gold
    scores only when the two are the same (a hedged "yes or no" earns nothing)."""
    if prediction is None:
        return 0.0
    key = _key(prediction)
    guess = key.split()
    best = 0.0
    for gold in _golds(golden_answers):
        if (key in _YES_NO or gold in _YES_NO) and key != gold:
            continue
        truth = gold.split()
        common = sum((Counter(guess) & Counter(truth)).values())
        if common:
            precision, recall = common / len(guess), common / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def mean(values: Sequence[float]) -> float | None:
    """The mean, or None when there is nothing to average."""
    return sum(values) / len(values) if values else None


def behaviour(episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How a group of episodes behaved: the fractions that were format-valid, forced and decomposed, the mean
    number of search rounds, and the decomposed fraction per question class (whether decomposition is learnt).

    Each episode gives ``question_class``, ``format_valid``, ``forced_answer``, ``decomposed`` and
    ``search_rounds`` (a count), as eval results and the agent's ``stats`` do. The one aggregation behind the
    rollout metrics, ``ps-agent trajectories show`` and the benchmarks.
    """

    def share(key: str, of: Sequence[Mapping[str, Any]] = episodes) -> float | None:
        return mean([float(e[key]) for e in of])

    classes = sorted({e["question_class"] for e in episodes})
    return {
        "format_valid": share("format_valid"),
        "forced_answer": share("forced_answer"),
        "decomposed": share("decomposed"),
        "search_rounds": share("search_rounds"),
        "decomposed_by_class": {
            c: share("decomposed", [e for e in episodes if e["question_class"] == c]) for c in classes
        },
    }


# a think block to its close, or, unclosed (cut at the token limit: the runaway think), to the next action or the end
_THINK = re.compile(r"<think>(.*?)(?:</think>|<search>|<answer>|\Z)", re.DOTALL)


def search_need(episodes: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The shares of episodes that searched in more rounds than their question needs (``over_search``) and in
    fewer (``under_search``), HiPRAG's two failures of a search agent. Each episode gives ``search_rounds`` and
    ``rounds_needed`` (``questions.rounds_needed``: one round per hop, every independent sub-query at once),
    so the sequential baseline, which searches a comparison's entities one round each, over-searches every
    comparison by design: the cost that splitting saves."""
    return {
        "over_search": mean([float(e["search_rounds"] > e["rounds_needed"]) for e in episodes]),
        "under_search": mean([float(e["search_rounds"] < e["rounds_needed"]) for e in episodes]),
    }


def think_lengths(episodes: Sequence[Mapping[str, Any]]) -> list[int]:
    """The number of words inside each ``<think>`` block of the episodes' turns (their ``timeline``), one cut at
    the token limit included."""
    return [
        len(block.split())
        for e in episodes
        for turn in e["timeline"]["turns"]
        for block in _THINK.findall(turn.get("completion") or "")  # none in lines logged before turns kept it
    ]


def think_words(episodes: Sequence[Mapping[str, Any]]) -> float | None:
    """The mean number of words inside a ``<think>`` block, over every think block of the episodes' turns: a
    think turn that shrinks to nothing, or grows without end, is a collapse signal."""
    return mean([float(n) for n in think_lengths(episodes)])
