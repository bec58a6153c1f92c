"""Answer metrics against known cases (SQuAD normalisation), and the aggregation of episode behaviour."""

import pytest

from ps_agent.metrics import (
    behaviour,
    cover_exact_match,
    exact_match,
    f1_score,
    mean,
    normalize_answer,
    search_need,
    think_words,
)


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


def test_an_empty_answer_matches_no_gold_that_normalisation_empties():
    """NQ's golds "A+", "*", "---" normalise to "": an empty answer scored EM 1 and the full outcome reward."""
    from ps_agent.rewards import reward_components
    from tests.test_rewards import trajectory

    for empty in ("", "the", "?"):
        assert exact_match(empty, ["A+", "AB+"]) == 0.0 and f1_score(empty, ["*"]) == 0.0
    assert exact_match("AB+", ["A+", "AB+"]) == 1.0
    assert exact_match("A+.", ["A+"]) == 1.0 and exact_match('"AB+"', ["A+", "AB+"]) == 1.0  # a sentence's marks
    empty_answer = trajectory(answer="", final="<think>none</think>\n<answer></answer>")
    assert reward_components(empty_answer, ["A+", "AB+"], "single-hop")["outcome"] == 0.0


def test_the_right_answer_matches_a_gold_that_normalisation_empties():
    """Such golds were dropped, so NQ's "most common blood type in Sweden" (gold "A+") could not be answered right:
    "A+" scored EM 0 and a wrong answer's reward."""
    from ps_agent.rewards import reward_components
    from tests.test_rewards import trajectory

    assert exact_match("A+", ["A+", "AB+"]) == 1.0 and exact_match(" a+ ", ["A+"]) == 1.0
    assert f1_score("A+", ["A+"]) == 1.0 and cover_exact_match("A+", ["A+"]) == 1.0
    assert exact_match("A", ["A+"]) == 0.0 and exact_match("B+", ["A+"]) == 0.0
    right = trajectory(answer="A+", final="<think>read it</think>\n<answer> A+ </answer>")
    assert reward_components(right, ["A+", "AB+"], "single-hop")["outcome"] == 1.0


def test_a_yes_no_answer_or_gold_gets_f1_only_when_they_agree():
    """HotpotQA's official F1: a hedged "yes or no" scored 0.5 against either gold."""
    assert f1_score("yes or no", ["yes"]) == 0.0 and f1_score("yes no", ["no"]) == 0.0
    assert f1_score("yes", ["yes"]) == 1.0 and f1_score("Yes.", ["yes"]) == 1.0
    assert f1_score("no", ["no way out"]) == 0.0  # a yes/no answer to another kind of gold
    assert f1_score("no way", ["no way out"]) == pytest.approx(0.8)


def test_cover_exact_match_needs_whole_words():
    assert cover_exact_match("It is the Nile, in Africa", ["Nile"]) == 1.0
    assert cover_exact_match("Nilesh", ["Nile"]) == 0.0
    assert cover_exact_match("anything", [""]) == 0.0


def test_f1():
    assert f1_score("Isaac Newton", ["Newton"]) == pytest.approx(2 / 3)
    assert f1_score("Paris", ["Rome", "Paris France"]) == pytest.approx(2 / 3)
    assert f1_score("London", ["Paris"]) == 0.0


def test_behaviour_of_a_group_of_episodes():
    episodes = [
        {"question_class": "parallelisable", "format_valid": True, "forced_answer": False, "decomposed": True,
         "search_rounds": 1},
        {"question_class": "parallelisable", "format_valid": False, "forced_answer": True, "decomposed": False,
         "search_rounds": 2},
        {"question_class": "sequential", "format_valid": True, "forced_answer": False, "decomposed": True,
         "search_rounds": 3},
        {"question_class": "sequential", "format_valid": True, "forced_answer": False, "decomposed": False,
         "search_rounds": 2},
        {"question_class": "sequential", "format_valid": True, "forced_answer": False, "decomposed": False,
         "search_rounds": 0},
    ]  # fmt: skip
    seen = behaviour(episodes)
    assert seen["decomposed_by_class"] == pytest.approx({"parallelisable": 1 / 2, "sequential": 1 / 3})
    assert {k: v for k, v in seen.items() if k != "decomposed_by_class"} == pytest.approx(
        {"format_valid": 4 / 5, "forced_answer": 1 / 5, "decomposed": 2 / 5, "search_rounds": 8 / 5}
    )
    assert behaviour([]) == {
        "format_valid": None,
        "forced_answer": None,
        "decomposed": None,
        "search_rounds": None,
        "decomposed_by_class": {},
    }
    assert mean([]) is None and mean([1.0, 2.0]) == 1.5


def test_over_and_under_search_and_think_length():
    """Issue 26: HiPRAG's two failures, against the rounds each question needs, and the think turns' length."""
    turns = [{"completion": "<think> one two three </think>\n<search> A ## B </search>"},
             {"completion": "<think> four </think> <answer> A </answer>"}]  # fmt: skip
    episodes = [
        {"search_rounds": 1, "rounds_needed": 1, "timeline": {"turns": turns}},
        {"search_rounds": 2, "rounds_needed": 1, "timeline": {"turns": []}},  # a comparison searched twice
        {"search_rounds": 1, "rounds_needed": 2, "timeline": {"turns": [{"completion": "<answer> A </answer>"}]}},
        {"search_rounds": 3, "rounds_needed": 4, "timeline": {"turns": [{"completion": None}]}},
    ]
    assert search_need(episodes) == pytest.approx({"over_search": 1 / 4, "under_search": 2 / 4})
    assert think_words(episodes) == pytest.approx(2.0)  # (3 + 1) words over two think blocks
    assert think_words(episodes[1:]) is None
    runaway = {"timeline": {"turns": [{"completion": "<think>" + "more " * 250}]}}  # cut at its token limit
    assert think_words([runaway]) == 250.0  # it was left out: None, and not logged
    assert think_words([{"timeline": {"turns": [{"completion": "<think> a b <search> q </search>"}]}}]) == 2.0
