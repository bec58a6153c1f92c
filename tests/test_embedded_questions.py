"""benchmarks/embedded_questions.py: every question's facts are stated by the embedded summaries it names, and its
answer is the one those facts give."""

import importlib.util
import re
import sys
from pathlib import Path

from ps_agent.retrieval.corpus import load_embedded_corpus

spec = importlib.util.spec_from_file_location(
    "embedded_questions", Path(__file__).parents[1] / "benchmarks" / "embedded_questions.py"
)
embedded_questions = sys.modules["embedded_questions"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(embedded_questions)

SMALLEST = ("first", "earlier", "older", "lower", "fewer")  # the words asking for the smallest value


def test_the_summaries_state_each_questions_facts_and_the_facts_give_its_answer():
    summaries = {p.title: p.text for p in load_embedded_corpus()}
    kinds = set()
    for q in embedded_questions.QUESTIONS:
        kind, question, answers, facts = q["kind"], q["question"], q["answers"], q["facts"]
        kinds.add(kind)
        for title, words in facts:
            assert words in summaries[title], (question, title, words)
        if kind == "comparison":
            values = {title: float(re.search(r"\d[\d,.]*", words).group().replace(",", "")) for title, words in facts}
            pick = min if set(re.findall(r"\w+", question)) & set(SMALLEST) else max
            assert pick(values, key=values.get) in answers, question
        else:  # a 2-hop answer is read in the second summary, reached through the first
            assert answers[0] in facts[-1][1], question
    assert kinds == {"comparison", "2-hop"}
    assert len({q["question"] for q in embedded_questions.QUESTIONS}) == len(embedded_questions.QUESTIONS)


def test_a_failed_run_is_a_wrong_answer_with_its_error_and_the_others_keep_theirs():
    question, other = embedded_questions.QUESTIONS[:2]
    answered = {"answer": other["answers"][0], "stats": {"llm_calls": 2},
                "trajectory": {"response": "<search> a ## b </search>"}}  # fmt: skip
    rows = [embedded_questions.question_row(question, TimeoutError("run_timeout_s=600 reached")),
            embedded_questions.question_row(other, answered)]  # fmt: skip
    assert rows[0]["right"] is False and "run_timeout_s=600" in rows[0]["error"] and rows[0]["llm_calls"] is None
    assert rows[1]["right"] is True and rows[1]["searches"] == [" a ## b "] and rows[1]["error"] is None
    page = embedded_questions.markdown("cmd", {"p": {"title field": rows}})
    assert "| p | title field | 1 of 2 |" in page and "failed: TimeoutError('run_timeout_s=600 reached')" in page
    assert "| 2.00 |" in page  # LLM calls averaged over the answered question only
