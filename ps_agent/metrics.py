"""Answer metrics with SQuAD normalisation: exact match, F1 and cover exact match."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, golden_answers: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer."""
    if prediction is None:
        return 0.0
    guess = normalize_answer(prediction)
    return float(any(guess == normalize_answer(gold) for gold in golden_answers))


def cover_exact_match(prediction: str | None, golden_answers: Sequence[str]) -> float:
    """1.0 if any normalised golden answer appears, as whole words, in the normalised prediction."""
    if prediction is None:
        return 0.0
    guess = f" {normalize_answer(prediction)} "
    return float(any(f" {normalize_answer(gold)} " in guess for gold in golden_answers if normalize_answer(gold)))


def f1_score(prediction: str | None, golden_answers: Sequence[str]) -> float:
    """The best token-level F1 over the golden answers."""
    if prediction is None:
        return 0.0
    guess = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_answers:
        truth = normalize_answer(gold).split()
        common = sum((Counter(guess) & Counter(truth)).values())
        if common:
            precision, recall = common / len(guess), common / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
