"""Every branch of the paper's reward equations (Eqs. 3–7), as table tests on hand-made trajectories, and the
TRL reward functions called as TRL calls them."""

import pytest

from ps_agent.questions import KNOWN_TYPES, question_class
from ps_agent.rewards import (
    RewardWeights,
    always_decompose_optimal,
    choose_alpha,
    decomposition_component,
    format_component,
    format_valid,
    outcome_component,
    reward_components,
    reward_functions,
    search_count_component,
)

W = RewardWeights()
THINK_SEARCH_2 = "<think> two parts </think>\n<search> a ## b </search>"
THINK_SEARCH_1 = "<think> one part </think>\n<search> a </search>"
THINK_ANSWER = "<think> done </think>\n<answer> Paris </answer>"


def call(action: str, completion: str) -> dict:
    return {"action": action, "completion": completion}


def trajectory(
    *rounds: list[str], answer: str | None = "Paris", final: str = THINK_ANSWER, action="answer", question=None
) -> dict:
    """A hand-made trajectory: one search turn per round (each round its distinct sub-queries), then ``final``; its
    question, unless given, names what the first round searched."""
    calls = [call("search", THINK_SEARCH_2 if len(r) > 1 else THINK_SEARCH_1) for r in rounds]
    return {
        "question": question or " or ".join(rounds[0] if rounds else ["Paris"]) + "?",
        "answer": answer,
        "llm_calls": [*calls, call(action, final)],
        "search_rounds": [{"sub_queries": r, "searched": r} for r in rounds],
    }


@pytest.mark.parametrize(
    ("question_type", "expected"),
    [
        ("comparison", "parallelisable"),
        (None, "single-hop"),
        ("", "single-hop"),
        ("bridge", "sequential"),
        ("compositional", "sequential"),
        ("inference", "sequential"),
        ("2hop", "sequential"),
        ("3hop1", "sequential"),
        ("3hop2", "sequential"),
        ("4hop1", "sequential"),
        ("4hop2", "sequential"),
        ("4hop3", "sequential"),
        ("single", "single-hop"),
        ("none", "single-hop"),
        ("bridge_comparison", "hybrid"),
        ("hybrid", "hybrid"),
    ],
)
def test_question_class(question_type, expected):
    assert question_class(question_type) == expected


def test_every_known_dataset_type_has_a_class():
    assert {t for t in KNOWN_TYPES if question_class(t)} == set(KNOWN_TYPES)


def test_an_unknown_type_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown question type 'bridgee'"):
        question_class("bridgee")


@pytest.mark.parametrize(
    ("answer", "golden", "expected"),
    [
        ("Paris", ["paris"], 1.0),
        ("The Paris.", ["Paris"], 1.0),
        ("Rome", ["Paris", "Rome"], 1.0),
        ("Paris, France", ["Paris"], 0.0),
        (None, ["Paris"], 0.0),
        ("", ["Paris"], 0.0),
    ],
)
def test_outcome_reward_is_exact_match(answer, golden, expected):
    assert outcome_component(trajectory(["Paris"], answer=answer), golden) == expected


def test_a_forced_answer_earns_no_outcome_and_is_not_valid_format():
    forced = trajectory(["Paris", "Berlin"], ["Rome"], answer="Paris", action="forced_answer", final=" Paris </answer>")
    assert outcome_component(forced, ["Paris"]) == 0.0
    assert format_valid(forced) is False
    parts = reward_components(forced, ["Paris"], "comparison")
    # nothing for the answer; no format bonus either, since format is invalid and the outcome is 0
    assert parts["outcome"] == 0.0
    assert parts["format"] == 0.0


@pytest.mark.parametrize(
    ("question_type", "rounds", "expected"),
    [
        ("comparison", [["Paris", "Berlin"]], 3 * 0.15),  # parallelisable and decomposed: α·λd
        ("comparison", [["Paris"], ["Berlin"]], 0.0),  # parallelisable, not decomposed
        ("bridge", [["Paris"], ["Berlin"]], 0.15),  # not parallelisable, not decomposed: λd
        ("bridge", [["Paris", "Berlin"], ["Rome"]], 0.0),  # not parallelisable, decomposed
        (None, [["Paris"]], 0.15),  # single-hop, not decomposed
        (None, [["Paris", "Berlin"]], 0.0),  # single-hop, decomposed
        (None, [], 0.15),  # no search at all is not a decomposition
        ("hybrid", [["Paris", "Berlin"], ["Rome", "Madrid"]], 3 * 0.15),  # hybrid decomposed: as parallelisable
        ("hybrid", [["Paris"], ["Berlin"], ["Rome"]], 0.0),
        ("bridge_comparison", [["Paris", "Berlin"], ["Rome", "Madrid"]], 3 * 0.15),
        # the whole question beside one of its names, or a rewording of itself, is not a split (was paid α·λd)
        ("comparison", [["Who was born first, Einstein or Newton?", "Einstein"]], 0.0),
        ("comparison", [["Who was born first, Einstein or Newton?", "who was born first einstein or newton"]], 0.0),
        ("bridge", [["Who directed Titanic?", "Titanic"]], 0.15),  # kept whole: λd
        ("comparison", [["Einstein birth", "Newton birth", "Einstein birth date"]], 3 * 0.15),  # two own parts
    ],
)
def test_decomposition_reward(question_type, rounds, expected):
    assert decomposition_component(trajectory(*rounds), question_type, W) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("question_type", "n", "expected"),
    [
        ("comparison", 0, -0.35),
        ("comparison", 1, 0.0),
        ("comparison", 3, -0.70),  # −λs·|n − 1|
        (None, 0, -0.35),
        (None, 1, 0.0),
        (None, 2, -0.35),
        ("bridge", 0, -0.70),
        ("bridge", 1, -0.35),
        ("bridge", 2, 0.0),
        ("bridge", 4, 0.0),  # −λs·|min(n,2) − 2|
        ("hybrid", 1, -0.35),  # hybrid: at least two rounds, as sequential
        ("hybrid", 2, 0.0),
        ("bridge_comparison", 3, 0.0),
    ],
)
def test_search_count_reward(question_type, n, expected):
    rounds = [["q"]] * n
    assert search_count_component(trajectory(*rounds), question_type, W) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("traj", "valid"),
    [
        (trajectory(["Paris", "Berlin"]), True),
        (trajectory(), True),  # answer straight away
        (trajectory(["Paris"], final="<answer> Paris </answer>"), False),  # no think
        (trajectory(["Paris"], final="<think> x </think><answer> Paris </answer> trailing"), False),
        (trajectory(["Paris"], final="<think> <search> </think><answer> Paris </answer>"), False),  # nested
        (trajectory(["Paris"], action="forced_answer", final=" Paris </answer>"), False),  # forced
        (
            {
                "answer": "x",
                "llm_calls": [call("invalid", "no tags"), call("answer", THINK_ANSWER)],
                "search_rounds": [],
            },
            False,
        ),
        ({"answer": None, "llm_calls": [], "search_rounds": []}, False),
    ],
)
def test_format_validity_is_a_state_machine_over_turns(traj, valid):
    assert format_valid(traj) is valid


@pytest.mark.parametrize(
    ("outcome", "valid", "expected"),
    [(1.0, False, -0.1), (0.0, True, 0.1), (1.0, True, 0.0), (0.0, False, 0.0)],
)
def test_format_reward(outcome, valid, expected):
    traj = trajectory(["Paris"]) if valid else trajectory(["Paris"], final="<answer> x </answer>")
    assert format_component(traj, outcome, W) == pytest.approx(expected)


def test_components_sum_and_weights_are_configurable():
    parts = reward_components(trajectory(["Paris", "Berlin"]), ["Paris"], "comparison")
    assert parts == pytest.approx(
        {"outcome": 1.0, "decomposition": 0.45, "search_count": 0.0, "format": 0.0, "total": 1.45}
    )
    custom = RewardWeights(decomposition=1.0, parallel_bonus=2.0, search_count=0.5, format=0.2)
    three = trajectory(["Paris"], ["Berlin"], ["Rome"], answer="Rome")
    parts = reward_components(three, ["Paris"], "comparison", custom)
    assert parts == pytest.approx(
        {"outcome": 0.0, "decomposition": 0.0, "search_count": -1.0, "format": 0.2, "total": -0.8}
    )


@pytest.mark.parametrize(
    ("fractions", "alpha", "optimal"),
    [
        ({"parallelisable": 0.2, "sequential": 0.8}, 3.0, False),  # 0.45·0.2 = 0.09 < 0.15·0.8 = 0.12
        ({"parallelisable": 0.3, "sequential": 0.7}, 3.0, True),  # 0.135 > 0.105
        ({"parallelisable": 0.2, "hybrid": 0.1, "sequential": 0.7}, 3.0, True),  # hybrids count as split
        ({"parallelisable": 0.5, "sequential": 0.5}, 1.0, False),  # equal: not strictly better
        ({"parallelisable": 0.5, "single-hop": 0.5}, 1.5, True),
    ],
)
def test_always_decompose_is_optimal_only_above_the_break_even_mix(fractions, alpha, optimal):
    assert always_decompose_optimal(fractions, RewardWeights(parallel_bonus=alpha)) is optimal


def rows_of(*types):
    return [{"question_type": t} for t in types]


def test_alpha_follows_the_training_mix_and_an_explicit_one_that_pays_always_splitting_is_refused():
    # a fifth to split: the paper's α = 3 is below the break-even (0.8 / 0.2 = 4), so it stands
    assert choose_alpha(rows_of("comparison", *["bridge"] * 4), None) == 3.0
    # half to split (hybrids count): break-even 1, so 80% of it
    assert choose_alpha(rows_of("comparison", "bridge_comparison", "bridge", None), None) == pytest.approx(0.8)
    assert choose_alpha(rows_of("bridge", None), None) == 3.0  # nothing to split: any α is safe
    # nothing to keep whole: splitting is right for every question, so the paper's α (it was 0: no r_d at all)
    assert choose_alpha(rows_of("comparison", "bridge_comparison"), None) == 3.0
    assert choose_alpha(rows_of("comparison"), 2.0) == 2.0  # and an explicit one is not refused
    assert choose_alpha(rows_of("comparison", "bridge"), 0.9) == 0.9  # explicit, below the break-even
    with pytest.raises(ValueError, match=r"50% of the questions should be decomposed.*below 1\.00"):
        choose_alpha(rows_of("comparison", "bridge"), 3.0)


def test_reward_functions_called_as_trl_calls_them_give_each_component_of_each_rollout():
    from trl.trainer.utils import get_callable_name

    weights = RewardWeights(decomposition=0.2, parallel_bonus=2.0, search_count=0.5, format=0.3)
    rollouts = [
        (trajectory(["Paris", "Berlin"]), ["Paris"], "comparison"),  # right, decomposed, one round
        (trajectory(["Paris"], ["Berlin"], ["Rome"], answer="Rome"), ["Paris"], "bridge"),  # wrong, three rounds
        (trajectory(["Paris"], answer="Paris", action="forced_answer", final=" Paris </answer>"), ["Paris"], None),
    ]
    trajectories, golden, types = (list(x) for x in zip(*rollouts, strict=True))
    # what GRPOTrainer._calculate_rewards passes: prompts, completions, completion_ids, every dataset column and
    # every extra field of the rollout function (one value per completion), and its hooks
    kwargs = {
        "prompts": ["Q1?", "Q2?", "Q3?"],
        "completions": ["…", "…", "…"],
        "completion_ids": [[1], [2], [3]],
        "golden_answers": golden,
        "question_type": types,
        "id": ["c1", "b1", "s1"],
        "trajectory": trajectories,
        "trainer_state": None,
        "log_extra": lambda column, values: None,
        "log_metric": lambda name, value: None,
    }
    funcs = reward_functions(weights)
    names = [get_callable_name(f).removesuffix("_reward") for f in funcs]
    assert names == ["outcome", "decomposition", "search_count", "format"]
    by_function = {name: f(**kwargs) for name, f in zip(names, funcs, strict=True)}
    for i, (traj, gold, kind) in enumerate(rollouts):
        expected = reward_components(traj, gold, kind, weights)
        assert {name: values[i] for name, values in by_function.items()} == pytest.approx(
            {k: v for k, v in expected.items() if k != "total"}
        )
    assert by_function["decomposition"][0] == pytest.approx(2.0 * 0.2)  # the weights reached the function
    assert by_function["search_count"][1] == 0.0 and by_function["format"][1] == pytest.approx(0.3)
    assert by_function["outcome"][2] == 0.0 and by_function["search_count"][2] == 0.0


@pytest.mark.parametrize(
    "searched",
    [
        ["Who was born first, Isaac Newton or Einstein?", "a"],  # the question beside a stopword
        ["Isaac Newton?", "1"],  # a lone digit names nothing
        ["Isaac Newton?", "the"],
        ["the", "of"],  # nothing to look up at all
        ["Isaac Newton", "r Isaac Newton", "1990"],  # a lone letter, and a bare year
    ],
)
def test_a_name_beside_a_word_that_names_nothing_is_not_a_split(searched):
    """Each of these rounds earned the full α·λd decomposition reward: GRPO's cheapest way to the bonus."""
    assert decomposition_component(trajectory(searched), "comparison", W) == 0.0


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        ([["Who was born first, Albert Einstein or Isaac Newton?", "zebra"]], 0.0),  # the question and a made-up word
        ([["Who was born first, Einstein or Newton", "zebra"]], 0.0),  # the question reworded and a made-up word
        ([["Albert Einstein"], ["Who was born first, Albert Einstein or Isaac Newton?", "Ulm"]], 0.0),  # whole again
        ([["Einstein birth", "Newton birth"]], 3 * 0.15),
        ([["Einstein and Newton"], ["Ulm 1879", "Woolsthorpe 1643"]], 3 * 0.15),  # names the passages gave
    ],
)
def test_a_sub_query_that_names_nothing_the_question_names_is_no_split_before_anything_is_read(rounds, expected):
    """The whole question beside a made-up word searched it once and earned the full α·λd, as a split."""
    question = "Who was born first, Albert Einstein or Isaac Newton?"
    assert decomposition_component(trajectory(*rounds, question=question), "hybrid", W) == pytest.approx(expected)


def test_sub_queries_that_differ_by_a_number_or_a_name_are_a_split():
    assert decomposition_component(trajectory(["Apollo 11 crew", "Apollo 13 crew"]), "comparison", W) > 0
    assert decomposition_component(trajectory(["Everest height", "K2 height"]), "comparison", W) > 0
