"""benchmarks/evidence.py from a hand-made set (questions, gold passages, corpus) and hand-made eval lines: which
gold passages the searches returned, whether the answer was among them, and the misses reading must fix."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("evidence", Path(__file__).parents[1] / "benchmarks" / "evidence.py")
evidence = sys.modules["evidence"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evidence)

CORPUS = {
    "p-film": '"Unbreakable"\nIn Unbreakable, a security guard named David Dunn survives a train crash.',
    "p-dunn": '"David Dunn"\nDunn is played by Bruce Willis.',
    "p-other": '"Elsewhere"\nNothing about the question.',
    "p-a": '"A"\nA was born in 1900.',
    "p-b": '"B"\nB was born in 1910.',
}
QUESTIONS = [
    {"id": "b1", "question": "Who plays the guard?", "golden_answers": ["Bruce Willis"], "type": "bridge",
     "supporting_doc_ids": ["p-film", "p-dunn"]},
    {"id": "b2", "question": "Who plays the guard in the other film?", "golden_answers": ["Bruce Willis"],
     "type": "bridge", "supporting_doc_ids": ["p-film", "p-dunn"]},
    {"id": "c1", "question": "Were A and B born in the same year?", "golden_answers": ["no"], "type": "comparison",
     "supporting_doc_ids": ["p-a", "p-b"]},
]  # fmt: skip


def line(qid, cls, answer, golden, em, rounds, dataset="toyqa", think="I found it."):
    return {
        "id": qid, "dataset": dataset, "mode": "parallel", "question": qid, "question_class": cls,
        "golden_answers": golden, "answer": answer, "em": em, "error": None,
        "timeline": {"turns": [{"completion": f"<think> {think} </think>\n<answer> {answer} </answer>"}],
                     "search_rounds": [
            {"sub_queries": ids, "results": [{"sub_query": i, "passages": [{"id": i, "title": i}], "error": None}
                                             for i in ids]}
            for ids in rounds
        ]},
    }  # fmt: skip


@pytest.fixture
def folders(tmp_path):
    data = tmp_path / "data" / "toyqa"
    data.mkdir(parents=True)
    (data / "dev.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (data / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "contents": t}) + "\n" for i, t in CORPUS.items()))
    lines = [
        line("b1", "sequential", "Bruce Willis", ["Bruce Willis"], 1.0, [["p-film"], ["p-dunn"]]),  # found, right
        line("b2", "sequential", "David Dunn", ["Bruce Willis"], 0.0, [["p-film"], ["p-film", "p-other"]]),  # 1 of 2
        line("c1", "parallelisable", "yes", ["no"], 0.0, [["p-a", "p-b"]]),  # yes/no: no passage spells it
        line("n1", "single-hop", "x", ["x"], 1.0, [["p-a"]], dataset="nocorpus"),  # a set without gold passages
    ]
    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return tmp_path / "data", run


def test_gold_passages_answers_retrieved_and_reading_misses(folders, tmp_path, capsys):
    data, run = folders
    out = tmp_path / "ev"
    rows = evidence.main(["--run", f"v={run}", "--data", str(data), "--out", str(out)])
    by = {(r["dataset"], r["class"]): r for r in rows}
    assert set(by) == {("toyqa", "all"), ("toyqa", "sequential"), ("toyqa", "parallelisable")}
    seq = by["toyqa", "sequential"]
    assert seq["n"] == 2 and seq["em"] == 50.0
    assert seq["support_found"] == 75.0 and seq["all_support"] == 50.0  # b1 both, b2 one of two
    # b2 never returned the passage naming Bruce Willis; b1 did and answered it
    assert seq["readable"] == 2 and seq["answer_retrieved"] == 50.0 and seq["em_when_retrieved"] == 100.0
    assert seq["retrieved_not_answered"] == 0.0
    comparison = by["toyqa", "parallelisable"]
    assert comparison["readable"] == 0 and comparison["answer_retrieved"] is None
    assert comparison["support_found"] == 100.0
    assert by["toyqa", "all"]["n"] == 3
    assert "nocorpus: no dev.jsonl and corpus.jsonl" in capsys.readouterr().err
    page = out.with_suffix(".md").read_text()
    sequential = (
        "| v | toyqa | sequential | 2 | 50.0 | 75.0 | 50.0 | 50.0 (2) | 100.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 |"
    )
    assert sequential in page
    assert "| v | toyqa | parallelisable | 1 | 0.0 | 100.0 | 100.0 | – (0) | – | – | – | – | – | – | – |" in page
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == rows


def test_an_answer_read_but_missed_counts_against_reading(folders, tmp_path):
    data, run = folders
    lines = [line("b2", "sequential", "David Dunn", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]])]
    (run / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = [r for r in evidence.main(["--run", f"v={run}", "--data", str(data), "--out", str(tmp_path / "e")])
              if r["class"] == "sequential"]  # fmt: skip
    assert row["answer_retrieved"] == 100.0 and row["em_when_retrieved"] == 0.0
    assert row["retrieved_not_answered"] == 100.0


@pytest.mark.parametrize(
    ("rounds", "think", "where"),
    [
        ([["p-film"], ["p-dunn"]], "Dunn is played by Bruce Willis.", "missed_quoted"),  # read it, answered another
        ([["p-film"], ["p-dunn"]], "A security guard named David Dunn.", "missed_last_round"),  # quoted another line
        ([["p-dunn"], ["p-film"]], "A security guard named David Dunn.", "missed_earlier_round"),  # chain went past it
    ],
)
def test_a_reading_miss_is_placed_where_the_answer_was(folders, tmp_path, rounds, think, where):
    data, run = folders
    lines = [
        line("b2", "sequential", "David Dunn", ["Bruce Willis"], 0.0, rounds, think=think),
        line("b1", "sequential", "Bruce Willis", ["Bruce Willis"], 1.0, rounds, think=think),  # right: no miss
    ]
    (run / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = [r for r in evidence.main(["--run", f"v={run}", "--data", str(data), "--out", str(tmp_path / "e")])
              if r["class"] == "sequential"]  # fmt: skip
    parts = {key: row[key] for key in evidence.MISSED}
    assert parts == {key: 50.0 if key == where else 0.0 for key in evidence.MISSED}
    assert sum(parts.values()) == row["retrieved_not_answered"]


def test_bad_runs_are_refused_with_what_was_expected(folders, tmp_path, capsys):
    data, run = folders
    with pytest.raises(SystemExit):
        evidence.main(["--run", str(run), "--data", str(data), "--out", str(tmp_path / "e")])
    assert "expected NAME=DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        evidence.main(["--run", f"v={run}", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "e")])
    assert "no question of these runs has gold passages" in capsys.readouterr().err


def test_a_wrong_answer_that_names_a_searched_query_is_counted(folders, tmp_path):
    data, run = folders
    lines = [
        line("b2", "sequential", "David Dunn", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]]),  # searched it
        line("b3", "sequential", "Dunn", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]]),  # words of a query
        line("b4", "sequential", "Bruce Willis", ["Bruce Willis"], 1.0, [["p-film"], ["p-dunn"]]),  # right
        line("b5", "sequential", "Unbreakable", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]]),  # never searched
    ]
    for record in lines:
        record["timeline"]["search_rounds"][-1]["sub_queries"] = ["David Dunn", "Bruce Willis"]  # b4's: not a miss
    questions = [dict(QUESTIONS[0], id=qid) for qid in ("b2", "b3", "b4", "b5")]
    (data / "toyqa" / "dev.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    (run / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = [r for r in evidence.main(["--run", f"v={run}", "--data", str(data), "--out", str(tmp_path / "e")])
              if r["class"] == "sequential"]  # fmt: skip
    assert row["wrong_searched_answer"] == 50.0


def test_a_quoted_miss_that_only_cuts_the_span_wrong_is_told_apart(folders, tmp_path):
    data, run = folders
    think = "Dunn is played by Bruce Willis."
    lines = [
        line("b2", "sequential", "Willis", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]], think=think),  # a part
        line("b3", "sequential", "actor Bruce Willis", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]], think=think),
        line("b4", "sequential", "David Dunn", ["Bruce Willis"], 0.0, [["p-film"], ["p-dunn"]], think=think),  # another
        line("b5", "sequential", "Bruce", ["Bruce Willis"], 0.0, [["p-dunn"], ["p-film"]]),  # nests, but not quoted
    ]
    questions = [dict(QUESTIONS[0], id=qid) for qid in ("b2", "b3", "b4", "b5")]
    (data / "toyqa" / "dev.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    (run / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = [r for r in evidence.main(["--run", f"v={run}", "--data", str(data), "--out", str(tmp_path / "e")])
              if r["class"] == "sequential"]  # fmt: skip
    assert row["missed_quoted"] == 75.0 and row["missed_quoted_span"] == 50.0


def test_a_question_whose_run_errored_counts_as_found_nothing_and_answered_wrong(folders, tmp_path):
    """An error line has no timeline: the script stopped with KeyError 'timeline'."""
    data, run = folders
    failed = {k: v for k, v in line("b2", "sequential", None, ["Bruce Willis"], 0.0, []).items() if k != "timeline"}
    lines = [line("b1", "sequential", "Bruce Willis", ["Bruce Willis"], 1.0, [["p-film"], ["p-dunn"]])]
    lines.append(failed | {"em": None, "error": "RuntimeError: boom"})
    (run / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = [r for r in evidence.main(["--run", f"v={run}", "--data", str(data), "--out", str(tmp_path / "e")])
              if r["class"] == "sequential"]  # fmt: skip
    assert row["n"] == 2 and row["em"] == 50.0 and row["support_found"] == 50.0 and row["answer_retrieved"] == 50.0
