"""Gold trajectories: plans from supporting titles, the teacher's turns, and episodes that are exactly the
tokens an RL rollout of the same text conditions on, with the loss on the model's turns only."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from ps_agent import ParallelSearchAgent
from ps_agent.llms import context_ids
from ps_agent.protocol import is_well_formed_turn, parse_action
from ps_agent.questions import split_part
from ps_agent.synthetic import generate
from training.gold import (
    GoldQuestion,
    TeacherPolicy,
    build_episodes,
    episode,
    plan_from_titles,
    sft_example,
    teacher_turns,
)


def record(qtype, question, titles):
    return {
        "question": question,
        "type": qtype,
        "supporting_titles": titles,
        "supporting_doc_ids": [f"id-{t}" for t in titles],
    }


def subs(plan):
    return [[step["sub_question"] for step in r] for r in plan]


@pytest.mark.parametrize(
    ("rec", "passages", "expected"),
    [
        (record("comparison", "Is A older than B (band)?", ["A", "B (band)"]), {}, [["A", "B (band)"]]),
        # the question names the first hop
        (record("bridge", "Who directed Unbreakable?", ["David Dunn", "Unbreakable (film)"]), {},
         [["Unbreakable (film)"], ["David Dunn"]]),
        # neither named: the passage that names the other comes first
        (record("compositional", "Where was the parent of X born?", ["Father", "Son"]),
         {"id-Son": "Son is the child of Father.", "id-Father": "Father was born in Y."}, [["Son"], ["Father"]]),
        (record("bridge_comparison", "Whose director was born first, Film A or Film B?",
                ["Film A", "Dir A", "Film B", "Dir B"]), {}, [["Film A", "Film B"], ["Dir A", "Dir B"]]),
        (record("3hop1", "q", ["P", "Q", "R"]), {}, [["P"], ["Q"], ["R"]]),
    ],
)  # fmt: skip
def test_plans_follow_from_supporting_titles(rec, passages, expected):
    assert subs(plan_from_titles(rec, passages)) == expected


@pytest.mark.parametrize(
    ("rec", "reason"),
    [
        (record(None, "q", []), "no supporting titles"),
        (record("bridge", "Who is it?", ["A", "B"]), "hop order not derivable"),
        (record("comparison", "A, B or C?", ["A", "B", "C"]), "comparison without two supporting titles"),
        (record("bridge", "q", ["A", "A"]), "repeated supporting title"),
    ],
)
def test_questions_without_a_derivable_plan_say_why(rec, reason):
    assert plan_from_titles(rec, {}).startswith(reason)


def test_the_train_and_validation_parts_are_stable_and_disjoint():
    ids = [f"q{i}" for i in range(1000)]
    parts = [split_part(i) for i in ids]
    assert parts == [split_part(i) for i in ids]
    assert 0.25 < parts.count("validation") / len(ids) < 0.35


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    corpus, questions = generate(seed=11, entities=120, out=tmp_path_factory.mktemp("synth"), per_family=1)
    rows = [json.loads(line) for line in questions.read_text().splitlines()]
    return [
        GoldQuestion(q["id"], q["question"], q["golden_answers"], q["type"], q["plan"], "synthetic", str(corpus))
        for q in rows
    ]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_teacher_turns_are_well_formed_and_follow_the_plan(world, mode):
    for q in world:
        turns = teacher_turns(q, mode, random.Random(0))
        assert all(is_well_formed_turn(t) for t in turns), turns
        actions = [parse_action(t, mode) for t in turns]
        searched = [list(a.sub_queries) for a in actions[:-1]]
        expected = subs(q.plan) if mode == "parallel" else [[s] for r in subs(q.plan) for s in r]
        assert searched == expected
        assert actions[-1].kind == "answer" and actions[-1].content == q.golden_answers[0]


def test_think_text_says_why_sub_questions_are_independent_or_dependent(world):
    by_family = {q.question_class: q for q in world}
    first = teacher_turns(by_family["parallelisable"], "parallel", random.Random(1))[0]
    assert any(w in first for w in ("independent", "on its own", "depends on another"))
    chain = teacher_turns(by_family["sequential"], "parallel", random.Random(1))[0]
    assert any(w in chain for w in ("depend", "one step at a time", "chain"))


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_a_gold_episode_is_the_rollout_context_and_masks_the_environment(world, tokenizer, mode):
    q = next(q for q in world if q.type == "comparison" and len(q.plan[0]) == 2)
    teacher = TeacherPolicy(tokenizer, {q.question: teacher_turns(q, mode, random.Random(0))})
    agent = ParallelSearchAgent(llm=teacher, retriever=q.corpus, mode=mode, topk=2)
    out = asyncio.run(agent.ainvoke({"question": q.question}))
    ep = episode(q, out, mode, tokenizer)
    trajectory = out["trajectory"]
    # the sequence trained on is what the policy is conditioned on in a rollout, then the end-of-turn token
    rollout_context = context_ids(tokenizer, trajectory["prompt_messages"], trajectory["transcript"])
    assert ep["prompt_ids"] + ep["completion_ids"] == [*rollout_context, tokenizer.eos_token_id]
    example = sft_example(ep)
    labelled = [t for t in example["labels"] if t != -100]
    model_text = "".join(s["text"] for s in trajectory["transcript"] if s["role"] == "model")
    assert tokenizer.decode(labelled) == model_text
    masked = [t for t, label in zip(example["input_ids"], example["labels"], strict=True) if label == -100]
    assert masked[: len(ep["prompt_ids"])] == ep["prompt_ids"]
    env_text = tokenizer.decode(masked[len(ep["prompt_ids"]) :])
    assert env_text.count("<information>") == len(trajectory["search_rounds"]) == (1 if mode == "parallel" else 2)


def test_left_out_episodes_are_counted_by_reason(world, tokenizer):
    deep = next(q for q in world if q.type == "bridge" and len(q.plan) == 4)
    wrong = next(q for q in world if q.type is None)
    wrong = GoldQuestion(
        "w", wrong.question, wrong.golden_answers, None,
        [[dict(wrong.plan[0][0], passage_id="not-in-corpus")]], "synthetic", wrong.corpus,
    )  # fmt: skip
    short = next(q for q in world if q.type == "comparison")
    episodes, skipped = build_episodes([deep, wrong, short], "parallel", tokenizer, max_length=64, topk=2)
    assert episodes == []
    assert skipped == {
        "needs 4 searches, more than max_turns=4 allows": 1,
        "a gold passage was not retrieved": 1,
        "longer than max_length=64 tokens": 1,
    }
