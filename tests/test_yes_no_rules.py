"""The gold's yes/no reading measured against real answers (``benchmarks/yes_no_rules.py``), and the share of made
"both" questions answered no (``gold.py --both-no-share``)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from benchmarks.yes_no_rules import agreement, check_kind, form, main, tally
from training.gold import limit_both_no
from training.gold import main as gold_main
from training.plans import WORLD_ENTITIES, WORLD_PER_FAMILY, GoldQuestion, synthetic_questions
from training.turns import read_yes_no, yes_no_reading

MAGAZINE = "Out Traveler is a gay and lesbian travel magazine."
DIGEST = "Reader's Digest is an American general-interest family magazine."
BAND = "Muzzle is an American rock band from Seattle."


def steps(*findings: tuple[str, str]) -> list[dict[str, str]]:
    return [{"sub_question": name, "finding": text, "passage_id": name} for name, text in findings]


def question(text: str, answer: str, last: list[dict[str, str]], source: str = "hotpotqa", i: int = 0):
    return GoldQuestion(f"{source}-{i}", text, [answer], "comparison", [last], source, "corpus.jsonl")


def test_the_reading_says_what_two_leads_state_whatever_the_answer():
    both = steps(("Out Traveler", MAGAZINE), ("Reader's Digest", DIGEST))
    check, yes = read_yes_no("Are Out Traveler and Reader's Digest both magazines?", both)
    assert yes and check.endswith("Out Traveler: yes; Reader's Digest: yes. Both.")
    one = steps(("Out Traveler", MAGAZINE), ("Muzzle", BAND))
    check, yes = read_yes_no("Are Out Traveler and Muzzle both magazines?", one)
    assert not yes and check.endswith("Out Traveler: yes; Muzzle: not stated. Not both.")
    # the gold keeps the check only where it gives the real answer
    assert yes_no_reading("Are Out Traveler and Muzzle both magazines?", one, "yes") is None
    assert yes_no_reading("Are Out Traveler and Muzzle both magazines?", one, "no") == check
    assert read_yes_no("Are Foo and Muzzle both magazines?", one) is None  # a name the question lacks


def test_the_tally_counts_each_answer_by_what_the_reading_says():
    both = steps(("Out Traveler", MAGAZINE), ("Reader's Digest", DIGEST))
    one = steps(("Out Traveler", MAGAZINE), ("Muzzle", BAND))
    questions = [
        question("Are Out Traveler and Reader's Digest both magazines?", "yes", both, i=0),
        question("Are Out Traveler and Muzzle both magazines?", "yes", one, i=1),  # the lead leaves it out
        question("Are Out Traveler and Muzzle both magazines?", "no", one, i=2),
        question("Do Out Traveler and Muzzle come from the same city?", "no", one, i=3),  # no country to read
        question("Which is older, Out Traveler or Muzzle?", "Muzzle", one, i=4),  # not yes/no
    ]
    cells = tally(questions)
    assert cells == {
        "both": {"no, read no": 1, "yes, read no": 1, "yes, read yes": 1},
        "same": {"no, read undecided": 1},
    }
    assert agreement(cells["both"]) == {
        "questions": 3, "answered yes": 2, "decided by the reading": 3, "reading right": 2, "always yes right": 2,
    }  # fmt: skip
    assert agreement(cells["same"])["decided by the reading"] == 0
    assert tally(questions, read=False)["both"] == {"no": 1, "yes": 2}
    assert (form("Were they born in the same city?"), form("Are both genera?")) == ("same", "both")


def test_the_benchmark_reads_the_shared_parts_and_writes_its_page(tmp_path):
    rows = main(["--seeds", "101", "--pairs", "4", "--out", str(tmp_path / "rules")])["rows"]
    assert {"hotpotqa train", "hotpotqa validation", "2wikimultihopqa train", "synthetic worlds 101"} <= set(rows)
    for source, forms in rows.items():
        for row in forms.values():
            assert sum(row["cells"].values()) == row["questions"], source
            assert row.get("reading right", 0) <= row.get("decided by the reading", row["questions"]), source
    # the pairs are made from the reading, so it decides each the way it is answered
    pairs = rows["hotpotqa pairs (4 a kind)"]["both"]
    assert pairs["questions"] > 0 and pairs["reading right"] == pairs["decided by the reading"] == pairs["questions"]
    page = (tmp_path / "rules.md").read_text()
    assert (
        page.startswith("`python benchmarks/yes_no_rules.py --seeds 101 --pairs 4")
        and "| hotpotqa train | both |" in page
    )
    with pytest.raises(SystemExit):
        main(["--pairs", "-1"])


def test_made_both_questions_answered_no_are_kept_to_the_share_asked(tmp_path, capsys):
    gold = synthetic_questions([101, 102], WORLD_ENTITIES, WORLD_PER_FAMILY, tmp_path)
    one = steps(("Out Traveler", MAGAZINE), ("Muzzle", BAND))
    real_no = question("Are Out Traveler and Muzzle both magazines?", "no", one)
    paired = [
        question("Are Out Traveler and Muzzle both magazines?", "yes" if i < 6 else "no", one, "set-pairs", i)
        for i in range(12)
    ]
    gold.questions += [real_no, *paired]
    before = tally(gold.questions, read=False)
    synthetic_both = Counter(
        q.golden_answers[0] for q in gold.questions if q.source == "synthetic" and form(q.question) == "both"
        and q.golden_answers[0] in ("yes", "no")
    )  # fmt: skip
    assert synthetic_both["no"] >= 4 and synthetic_both["yes"] >= 4  # the worlds answer about half no
    limit_both_no(gold, 0.25)
    after = Counter(
        (q.source, q.golden_answers[0]) for q in gold.questions if form(q.question) == "both"
        and q.golden_answers[0] in ("yes", "no")
    )  # fmt: skip
    # every yes kept; no at most a quarter of each made source's "both" questions; the real question kept
    assert after[("synthetic", "yes")] == synthetic_both["yes"]
    assert after[("synthetic", "no")] == synthetic_both["yes"] // 3
    assert (after[("set-pairs", "yes")], after[("set-pairs", "no")]) == (6, 2)
    assert after[("hotpotqa", "no")] == 1
    assert tally(gold.questions, read=False)["same"] == before["same"]  # "the same" questions untouched
    dropped = synthetic_both["no"] - synthetic_both["yes"] // 3 + 4
    assert gold.skipped['a made "both" question answered no, beyond --both-no-share 0.25'] == dropped
    limit_both_no(gold, 0.0)
    assert not any(q.golden_answers[0] == "no" and form(q.question) == "both" and q.source != "hotpotqa"
                   for q in gold.questions)  # fmt: skip
    for bad in ("1", "-0.1"):
        with pytest.raises(SystemExit):
            gold_main(["--both-no-share", bad])
        assert f"--both-no-share {float(bad)}: expected a share from 0 up to, not including, 1" in (
            capsys.readouterr().err
        )


def test_a_policys_yes_no_answers_are_counted_by_the_check_it_spelt_out(tmp_path, capsys):
    assert check_kind('The question asks whether both are "Armenian". Armenian and Armenian-American: not both.') == (
        "value"
    )
    assert check_kind("The question asks whether both are magazines. A: yes; B: not stated. Not both.") == "reading"
    assert check_kind("The question asks whether they are from the same country. A: Chile; B: Peru: different.") == (
        "same"
    )
    assert check_kind("<think> I found A and B. So the answer is yes. </think>") == "none"
    lines = [
        ("Are A and B both magazines?", "yes", "no", 'The question asks whether both are "magazine". x: not both.'),
        ("Are A and B both magazines?", "no", "yes", "So the answer is yes."),
        ("Are C and D from the same country?", "no", "no", "The question asks whether they are the same. E: x"),
        ("Which is older, A or B?", "A", "A", "The question asks for the earliest."),
    ]
    records = [
        {"id": str(i), "dataset": "hotpotqa", "mode": "parallel", "question": q, "golden_answers": [gold],
         "question_class": "parallelisable", "error": None, "answer": said, "em": float(said == gold),
         "timeline": {"turns": [{"completion": turn}]}}
        for i, (q, gold, said, turn) in enumerate(lines)
    ]  # fmt: skip
    (tmp_path / "run" / "results").mkdir(parents=True)
    (tmp_path / "run" / "results" / "hotpotqa.parallel.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    out = main(["--seeds", "101", "--pairs", "0", "--run", f"v={tmp_path / 'run'}", "--out", str(tmp_path / "r")])
    assert out["runs"]["v"] == {
        "both": {"no, answered yes, none": 1, "yes, answered no, value": 1},
        "same": {"no, answered no, same": 1},
    }
    assert "| v | both | no, answered yes, none: 1; yes, answered no, value: 1 |" in (tmp_path / "r.md").read_text()
    with pytest.raises(SystemExit):
        main(["--pairs", "0", "--run", f"v={tmp_path}", "--out", str(tmp_path / "r")])
    assert "has no results/ folder" in capsys.readouterr().err
