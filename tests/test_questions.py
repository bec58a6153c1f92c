"""Question files: every kind of bad line is named by file and line (or skipped and counted), and ids of
rows without one do not depend on how the path is spelled."""

import json

import pytest

from ps_agent.questions import DataError, question_class, read_jsonl, read_split, rounds_needed

GOOD = b'{"question": "Who?", "golden_answers": ["A"]}'
BAD_LINES = [
    (b'{"question": "\\ud800 who?", "golden_answers": ["A"]}', r"'\\ud800' is not valid Unicode"),
    (b'{"question": "Who?", "golden_answers": ["\\udfff"]}', r"'\\udfff' is not valid Unicode"),
    (b'{"question": "caf\xe9?", "golden_answers": ["A"]}', r"not UTF-8 text \(invalid continuation byte"),
    (b"{not json", r"not JSON"),
    (b'{"golden_answers": ["A"]}', r"missing or empty 'question'"),
    (b'{"question": "Which?", "golden_answers": ["A"], "type": ["bridge"]}', r"unknown question type \['bridge'\]"),
    (b'{"question": "Who?", "golden_answers": ["A"], "optimal_rounds": 0}', r"'optimal_rounds' must be a positive"),
    # a CSV export's list: the one answer "['A', 'B']" matched nothing
    (b'{"question": "Who?", "golden_answers": "[\'A\', \'B\']"}', r"'golden_answers' is a string spelling a list"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_a_bad_line_is_an_error_naming_file_and_line_or_is_skipped(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\n".join([GOOD, line, GOOD.replace(b"Who", b"Where")]) + b"\n")
    with pytest.raises(DataError, match=rf"q\.jsonl:2: {message}"):
        read_jsonl(path)
    problems: list[str] = []
    assert [r["question"] for r in read_jsonl(path, problems=problems)] == ["Who?", "Where?"]
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: ")


def test_a_file_of_only_bad_lines_says_so(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"{not json\n\xff\n")
    with pytest.raises(DataError, match=r"no questions in .*q\.jsonl: all 2 lines are bad, the first: .*q\.jsonl:1: "):
        read_jsonl(path, problems=[])


def test_ids_of_rows_without_one_do_not_depend_on_the_path_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [{"question": "Who?", "golden_answers": ["A"]}, {"question": "Where?", "golden_answers": ["B"], "id": None}]
    rows += [rows[0], {"question": "What?", "golden_answers": ["C"], "id": 7}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [r["id"] for r in read_jsonl("q.jsonl")]
    assert ids == [r["id"] for r in read_jsonl("./q.jsonl")] == [r["id"] for r in read_jsonl(tmp_path / "q.jsonl")]
    assert ids[0].startswith("sha1-") and ids[2] == ids[0] + "#2" and ids[3] == "7"
    assert len(set(ids)) == 4


def test_the_rounds_a_question_needs_come_from_its_plan_its_hops_or_its_class(tmp_path):
    """Issue 26: over- and under-search are measured against these."""
    lines = [
        {"question": "X of Y of Z?", "golden_answers": ["A"], "type": "bridge", "optimal_rounds": 3},  # synthetic
        {"question": "X of Y?", "golden_answers": ["A"], "type": "bridge"},  # HotpotQA: two hops
        {"question": "W of X of Y of Z?", "golden_answers": ["A"], "type": "4hop2"},  # MuSiQue
        {"question": "A or B?", "golden_answers": ["A"], "type": "comparison"},
        {"question": "Whose director was born first?", "golden_answers": ["A"], "type": "bridge_comparison"},
        {"question": "Who?", "golden_answers": ["A"]},
    ]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [rounds_needed(row) for row in read_jsonl(path)] == [3, 2, 4, 1, 2, 1]


def test_a_repeated_id_is_an_error_naming_both_lines(tmp_path):
    """Ids 7 and "7" were one id: the report, which keeps results by id, dropped one of the two questions."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": 7, "question": "Who?", "golden_answers": ["A"]}\n'
                    '{"id": "7", "question": "Where?", "golden_answers": ["B"]}\n')  # fmt: skip
    with pytest.raises(DataError, match=r"q\.jsonl:2: id '7' is also that of .*q\.jsonl:1; expected ids unique"):
        read_jsonl(path)


def test_a_split_part_is_read_from_checked_lines(tmp_path):
    """read_split returned raw records: a string answer was later read letter by letter ("yes" → "y")."""
    from ps_agent.questions import read_split

    path = tmp_path / "dev.jsonl"
    lines = [{"id": f"q{i}", "question": f"Q{i}?", "golden_answers": ["yes"]} for i in range(6)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert len(read_split(path, "train")) + len(read_split(path, "validation")) == 6
    path.write_text(path.read_text() + json.dumps({"id": "q9", "question": "Q9?", "golden_answers": None}) + "\n")
    with pytest.raises(DataError, match=r"dev\.jsonl:7: missing or empty 'golden_answers'"):
        read_split(path, "train")


def test_flashrag_rows_keep_their_type_in_metadata_and_none_is_single_hop(tmp_path):
    """FlashRAG's rows keep the type in metadata.type: they loaded as single-hop, so a right split of a comparison
    earned no decomposition reward; "type": "none", which the error message offered, was refused."""
    path = tmp_path / "q.jsonl"
    rows = [
        {"id": "a", "question": "Older, A or B?", "golden_answers": ["A"], "metadata": {"type": "comparison"}},
        {"id": "b", "question": "Who?", "golden_answers": ["C"], "type": "none"},
        {"id": "c", "question": "Who?", "golden_answers": ["C"], "type": False},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert [r["question_type"] for r in read_jsonl(path)] == ["comparison", None]
    path.write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(DataError, match=r"q\.jsonl:1: unknown question type False"):  # was taken as single-hop
        read_jsonl(path)


def test_bamboogle_questions_without_a_type_are_two_hop_chains_not_single_hop(tmp_path):
    """Bamboogle's files give no type: its 2-hop questions were pooled with NQ's as single-hop."""
    line = json.dumps({"id": "1", "question": "Who was president when Citibank was founded?", "golden_answers": ["x"]})
    for name, expected in (("bamboogle", "sequential"), ("nq", "single-hop")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "dev.jsonl").write_text(line + "\n")
        (row,) = read_jsonl(tmp_path / name / "dev.jsonl")
        assert (question_class(row["question_type"]), rounds_needed(row)) == (
            expected,
            2 if expected == "sequential" else 1,
        )


def test_a_repeated_question_without_an_id_falls_in_one_part_of_the_split(tmp_path):
    """Its copies got the ids KEY, KEY#2, KEY#3, each hashed on its own: 4 of 6 such questions were in both
    parts, trained on and validated on; and read_split failed with KeyError 'id' on an id-less line."""
    from ps_agent.questions import read_split, row_part

    lines = [json.dumps({"question": f"Who wrote book {i}?", "golden_answers": [f"A{i}"]}) for i in range(12)]
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(line + "\n" for line in lines for _ in range(3)))
    rows = read_jsonl(path)
    parts: dict[str, set[str]] = {}
    for row in rows:
        parts.setdefault(row["question"], set()).add(row_part(row))
    assert all(len(found) == 1 for found in parts.values()) and len({p for s in parts.values() for p in s}) == 2
    train, validation = read_split(path, "train"), read_split(path, "validation")
    assert len(train) + len(validation) == 36 and not {r["question"] for r in train} & {
        r["question"] for r in validation
    }


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_it(tmp_path):
    """An editor's UTF-8 BOM made line 1 "not JSON": its question was skipped, or stopped a --strict eval."""
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join([GOOD, GOOD.replace(b"Who", b"Where")]) + b"\n")
    assert [r["question"] for r in read_jsonl(path)] == ["Who?", "Where?"]
    assert [r["question"] for r in read_split(path, "train") + read_split(path, "validation")] == ["Who?", "Where?"]


def test_a_validation_question_sharing_a_hop_with_a_train_question_is_held_out_of_both_parts(tmp_path):
    """MuSiQue composes questions over shared sub-questions: 3 of its 24 validation questions shared one with a
    train question (the train one's answer is their bridge), and were validated on as if never seen."""
    from ps_agent.eval import EvalSettings, _part
    from ps_agent.questions import hops, read_split, row_parts, split_part

    ids = ["2hop__1_900", "3hop1__2_77_900", "2hop__7_901", "2hop__8_77"]
    assert [split_part(i) for i in ids[:3]] == ["train", "validation", "validation"]  # the hash's parts, as given
    assert hops("3hop1__2_77_900") == {"2", "77", "900"} and hops("sha1-0123456789abcdef") == frozenset()
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps({"id": i, "question": f"Q {i}?", "golden_answers": ["A"]}) + "\n" for i in ids))
    rows = read_jsonl(path)
    assert row_parts(rows)[:3] == ["train", "held-out", "validation"]
    validation = [r["id"] for r in read_split(path, "validation")]
    assert "3hop1__2_77_900" not in validation and "2hop__7_901" in validation
    assert [r["id"] for r in read_split(path, "train")] == [i for i in ids if split_part(i) == "train"]  # as before
    assert [r["id"] for r in _part(rows, EvalSettings(llm="x", part="validation"))] == validation
