"""benchmarks/bridge_quotes.py on a hand-made shared set: which quote rule of a chain's last passage holds the
answer, with yes/no chains and comparisons left out."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ps_agent.questions import split_part

spec = importlib.util.spec_from_file_location(
    "bridge_quotes", Path(__file__).parents[1] / "benchmarks" / "bridge_quotes.py"
)
bridge_quotes = sys.modules["bridge_quotes"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bridge_quotes)

CORPUS = {
    "p1": '"Blue Moon"\nBlue Moon was directed by Jo Park.',
    "p2": '"Jo Park"\nJo Park is a director from Seoul. Park was born in 1950.',
    "p3": '"Red Sun"\nRed Sun was directed by Al Kim.',
    "p4": '"Al Kim"\nAl Kim is a director. Kim directed Red Sun in 1990. Kim was buried in Busan.',
}
ROWS = [
    # the first sentence holds the answer; the words of the question tie, so quote_for keeps it alone
    {"id": "q1", "question": "Where was the director of Blue Moon born?", "golden_answers": ["Seoul"],
     "type": "bridge", "supporting_titles": ["Blue Moon", "Jo Park"], "supporting_doc_ids": ["p1", "p2"]},
    # "directed Red Sun" shares more of the question than "buried in Busan" until the first hop's words are spent
    {"id": "q2", "question": "Where was the director of Red Sun buried?", "golden_answers": ["Busan"],
     "type": "bridge", "supporting_titles": ["Red Sun", "Al Kim"], "supporting_doc_ids": ["p3", "p4"]},
    # the answer is the entity the gold searched last
    {"id": "q12", "question": "Which director made Blue Moon?", "golden_answers": ["Jo Park"],
     "type": "bridge", "supporting_titles": ["Blue Moon", "Jo Park"], "supporting_doc_ids": ["p1", "p2"]},
    # and the question asks for what its passage says ("director from Seoul"): the gold checks it
    {"id": "q13", "question": "Which director from Seoul made Blue Moon?", "golden_answers": ["Jo Park"],
     "type": "bridge", "supporting_titles": ["Blue Moon", "Jo Park"], "supporting_doc_ids": ["p1", "p2"]},
    {"id": "q3", "question": "Was the director of Blue Moon born in Seoul?", "golden_answers": ["yes"],
     "type": "bridge", "supporting_titles": ["Blue Moon", "Jo Park"], "supporting_doc_ids": ["p1", "p2"]},
    {"id": "q4", "question": "Which film came first, Blue Moon or Red Sun?", "golden_answers": ["Blue Moon"],
     "type": "comparison", "supporting_titles": ["Blue Moon", "Red Sun"], "supporting_doc_ids": ["p1", "p3"]},
]  # fmt: skip


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data" / "toyqa"
    folder.mkdir(parents=True)
    assert {split_part(r["id"]) for r in ROWS} == {"train"}
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"id": i, "contents": t}) + "\n" for i, t in CORPUS.items())
    )
    return tmp_path / "data"


def test_each_rule_is_counted_on_the_chains_whose_answer_is_a_name(data, tmp_path):
    out = tmp_path / "bq"
    rows = bridge_quotes.main(["--data", str(data), "--sets", "toyqa", "--out", str(out)])
    held = {r["rule"]: r["held"] for r in rows}
    assert list(held.values()) == [4, 3, 3, 4]  # answer-naming, first, first + shared words, words spent
    # q12 and q13 answer with the entity searched last; q13's answer turn checks it; q3 (yes) and q4 are left out
    assert {(r["n"], r["in_passage"], r["answer_searched"], r["answer_checked"]) for r in rows} == {(4, 4, 2, 1)}
    page = out.with_suffix(".md").read_text()
    assert "| toyqa | the same, without the earlier hops' words | 4 | 4 | 4 | 100.0 |" in page
    assert "| toyqa | 4 | 2 | 50.0 | 1 |" in page
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == rows


def test_a_folder_without_chains_is_refused_with_what_was_expected(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bridge_quotes.main(["--data", str(tmp_path), "--sets", "toyqa", "--out", str(tmp_path / "bq")])
    err = capsys.readouterr().err
    assert "toyqa: no dev.jsonl and corpus.jsonl" in err and "no chain with a gold plan in toyqa" in err
