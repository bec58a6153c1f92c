"""Answer metrics against known cases (SQuAD normalisation)."""

import pytest

from ps_agent.metrics import cover_exact_match, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("text", "normal"),
    [("The Eiffel Tower!", "eiffel tower"), ("  A  cat, an apple ", "cat apple"), ("U.S.A.", "usa"), ("", "")],
)
def test_normalisation(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match():
    assert exact_match("the Nile", ["Nile"]) == 1.0
    assert exact_match("Nile river", ["Nile"]) == 0.0
    assert exact_match(None, ["Nile"]) == 0.0


def test_cover_exact_match_needs_whole_words():
    assert cover_exact_match("It is the Nile, in Africa", ["Nile"]) == 1.0
    assert cover_exact_match("Nilesh", ["Nile"]) == 0.0
    assert cover_exact_match("anything", [""]) == 0.0


def test_f1():
    assert f1_score("Isaac Newton", ["Newton"]) == pytest.approx(2 / 3)
    assert f1_score("Paris", ["Rome", "Paris France"]) == pytest.approx(2 / 3)
    assert f1_score("London", ["Paris"]) == 0.0
