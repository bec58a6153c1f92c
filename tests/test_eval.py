"""Evaluation: reports from a hand-made results file, bad data lines, resumption (errors retried, torn lines),
settings and corpus checked up front, and `ps-agent eval` end to end."""

import hashlib
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ps_agent.eval import EvalFailed, EvalSettings, evaluate
from ps_agent.eval_report import class_table, report, summarise_results
from ps_agent.questions import row_part
from ps_agent.synthetic import GoldPlanPolicy, generate

PS_AGENT = str(Path(sys.executable).parent / "ps-agent")


def result(dataset, mode, cls_type, em, decomposed, calls, latency, error=None):
    record = {
        "id": f"{dataset}-{mode}-{em}-{calls}",
        "dataset": dataset,
        "mode": mode,
        "question": "q",
        "question_type": cls_type,
        "golden_answers": ["a"],
        "answer": "a" if em else "b",  # the report scores the answer again
        "latency_s": latency,
        "error": error,
        "question_class": {"comparison": "parallelisable", None: "single-hop"}.get(cls_type, "sequential"),
        "forced_answer": False,
    }
    if error is None:
        record |= {
            "em": em,
            "f1": em,
            "cover_em": em,
            "decomposed": decomposed,
            "format_valid": True,
            "llm_calls": calls,
            "search_rounds": calls - 1,
            "rewards": {"total": em},
        }
    return record


def test_report_aggregates_a_hand_made_results_file(tmp_path):
    rows = [
        result("hotpotqa", "parallel", "comparison", 1.0, True, 2, 1.0),
        result("hotpotqa", "parallel", "comparison", 0.0, True, 2, 3.0),
        result("hotpotqa", "sequential", "comparison", 1.0, False, 3, 2.0),
        result("hotpotqa", "sequential", "comparison", 1.0, False, 4, 4.0),
        result("hotpotqa", "parallel", "bridge", 0.0, False, 3, 2.0),
        result("hotpotqa", "sequential", "bridge", 0.0, False, 3, 2.0, error="RuntimeError: boom"),
    ]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "hotpotqa.all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = report(tmp_path)
    par = summary["by_class"]["hotpotqa/parallelisable"]
    assert (
        par["parallel"] | {"em": 50.0, "decomposition_ratio": 100.0, "turns": 2.0, "seconds_per_question": 2.0}
        == par["parallel"]
    )
    assert par["sequential"]["em"] == 100.0 and par["sequential"]["turns"] == 3.5
    errored = summary["by_class"]["hotpotqa/sequential"]["sequential"]  # scores 0, and shows no behaviour
    assert errored == {"n": 1, "errors": 1, "em": 0.0, "f1": 0.0, "cover_em": 0.0}
    assert summary["by_dataset"]["hotpotqa"]["parallel"]["em"] == pytest.approx(100 / 3)
    sequential = summary["by_dataset"]["hotpotqa"]["sequential"]  # 2 right, 1 errored: scores 0 in EM and F1
    assert (sequential["n"], sequential["errors"], sequential["em"], sequential["turns"]) == (3, 1, 200 / 3, 3.5)
    text = (tmp_path / "report.md").read_text()
    assert "| hotpotqa/parallelisable | 2 |" in text and (tmp_path / "plots.png").stat().st_size > 0


@pytest.fixture
def synthetic(tmp_path):
    corpus, questions = generate(seed=1, entities=60, out=tmp_path / "synth")
    return corpus, questions, [json.loads(line) for line in questions.read_text().splitlines()]


def test_bad_lines_are_reported_with_their_line_number_and_skipped(synthetic, tmp_path):
    corpus, questions, rows = synthetic
    data = tmp_path / "mixed.jsonl"
    lines = questions.read_text().splitlines()[:3]
    data.write_text("\n".join([lines[0], '{"question": "no answers"}', lines[1], "{bad json", lines[2]]) + "\n")
    settings = EvalSettings(
        llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), agent={"max_turns": 10}
    )
    summary = evaluate([data], tmp_path / "out", settings)
    assert summary["overall"]["parallel"]["n"] == 3 and summary["overall"]["parallel"]["em"] == 100.0
    assert [p.split(": ")[0] for p in summary["skipped_lines"]] == [f"{data}:2", f"{data}:4"]
    assert "Skipped data lines (2)" in (tmp_path / "out" / "report.md").read_text()
    rebuilt = report(tmp_path / "out")  # `ps-agent report`: from the results alone, the record of skipped lines kept
    assert rebuilt["skipped_lines"] == summary["skipped_lines"]
    assert "Skipped data lines (2)" in (tmp_path / "out" / "report.md").read_text()
    with pytest.raises(ValueError, match=r"mixed\.jsonl:2: missing or empty 'golden_answers'"):
        evaluate(
            [data], tmp_path / "strict", EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), strict=True)
        )


class FailingOn(GoldPlanPolicy):
    """Test double: the gold-plan oracle, except that the LLM call fails for questions containing ``fail_on``."""

    def __init__(self, rows, fail_on):
        super().__init__(rows)
        self.fail_on = fail_on

    async def acomplete(self, prompt, transcript, **kwargs):
        if self.fail_on in prompt[-1]["content"]:
            raise ConnectionError("model server went away")
        return await super().acomplete(prompt, transcript, **kwargs)


def test_errors_are_counted_and_a_rerun_retries_them(synthetic, tmp_path):
    corpus, questions, rows = synthetic
    out = tmp_path / "out"
    failing = FailingOn(rows, rows[1]["question"])
    settings = EvalSettings(llm=failing, retriever=str(corpus), modes=("parallel",), limit=3, agent={"max_turns": 10})
    summary = evaluate([questions], out, settings)
    assert summary["overall"]["parallel"] | {"n": 3, "errors": 1, "em": 200 / 3} == summary["overall"]["parallel"]
    results = out / "results" / "synth.parallel.jsonl"
    error_line = [json.loads(x) for x in results.read_text().splitlines() if json.loads(x)["error"]]
    assert error_line[0]["error"].startswith("AgentError: LLM call failed on turn 1: ConnectionError")
    # a rerun with more questions, the LLM still failing on that question: the new ones and the errored one run
    settings.limit = 5
    summary = evaluate([questions], out, settings)
    assert len(results.read_text().splitlines()) == 3 + 3
    assert summary["overall"]["parallel"] | {"n": 5, "errors": 1} == summary["overall"]["parallel"]
    # the outage is over: only the errored question runs again, and the report counts its latest line once
    settings.llm = GoldPlanPolicy(rows)
    summary = evaluate([questions], out, settings)
    assert [json.loads(x)["id"] for x in results.read_text().splitlines()][6:] == [rows[1]["id"]]
    assert summary["overall"]["parallel"] | {"n": 5, "errors": 0, "em": 100.0} == summary["overall"]["parallel"]


def test_a_question_whose_every_search_failed_is_an_error_not_a_score(synthetic, tmp_path):
    """A retrieval server that cannot be reached: each search failed, the model answered without a passage, and the
    report gave those answers' EM with 0 errors, exit 0."""
    corpus, questions, rows = synthetic
    settings = EvalSettings(
        llm=GoldPlanPolicy(rows), retriever="http://127.0.0.1:9/retrieve", modes=("parallel",), limit=2,
        agent={"max_turns": 3, "search_retries": 0},
    )  # fmt: skip
    with pytest.raises(EvalFailed, match=r"all 2 questions run failed, the first with SearchesFailed: every search"):
        evaluate([questions], tmp_path / "out", settings)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["parallel"] == {"n": 2, "errors": 2, "em": 0.0, "f1": 0.0, "cover_em": 0.0}
    settings.retriever = str(corpus)  # the retriever is back: both questions run again, and are answered
    assert evaluate([questions], tmp_path / "out2", settings)["overall"]["parallel"]["errors"] == 0


def test_a_run_where_every_question_fails_is_an_error(synthetic, tmp_path):
    corpus, questions, rows = synthetic
    settings = EvalSettings(llm=FailingOn(rows, ""), retriever=str(corpus), modes=("parallel",), limit=2)
    with pytest.raises(EvalFailed, match=r"all 2 questions run failed, the first with AgentError: .*ConnectionError"):
        evaluate([questions], tmp_path / "out", settings)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())  # the report is still written
    assert summary["overall"]["parallel"] == {"n": 2, "errors": 2, "em": 0.0, "f1": 0.0, "cover_em": 0.0}
    # a rerun with nothing left to do is not a failure
    settings.llm = GoldPlanPolicy(rows)
    evaluate([questions], tmp_path / "out", settings)
    assert evaluate([questions], tmp_path / "out", settings)["overall"]["parallel"]["errors"] == 0


def test_a_misnamed_llm_is_refused_before_any_question_runs_and_error_lines_do_not_hold_a_folder(synthetic, tmp_path):
    """`--llm bogus` wrote an error line per question, and the folder then refused the corrected command as
    "answers of weights not on record"."""
    from ps_agent.llms import LLMSpecError
    from ps_agent.provenance import recorded_run

    corpus, questions, rows = synthetic
    settings = EvalSettings(llm="bogus", retriever=str(corpus), modes=("parallel",), limit=2)
    with pytest.raises(LLMSpecError, match="unknown LLM spec 'bogus'"):
        evaluate([questions], tmp_path / "out", settings)
    assert not (tmp_path / "out" / "results").exists() and not (tmp_path / "out" / "runs.jsonl").exists()
    failing = EvalSettings(llm=FailingOn(rows, ""), retriever=str(corpus), modes=("parallel",), limit=2)
    with pytest.raises(EvalFailed):
        evaluate([questions], tmp_path / "out", failing)
    assert recorded_run(tmp_path / "out") is None  # only error lines: nothing to resume, any model may rerun them
    settings.llm, settings.weights = GoldPlanPolicy(rows), [str(corpus)]  # now another model, with weights on record
    summary = evaluate([questions], tmp_path / "out", settings)["overall"]["parallel"]
    assert summary | {"n": 2, "errors": 0, "em": 100.0} == summary


def test_two_data_files_reported_under_one_name_are_refused(synthetic, tmp_path):
    """coll/dev.jsonl and coll/test.jsonl shared results/coll.*.jsonl: test.jsonl's id 1 was taken as answered."""
    corpus, questions, rows = synthetic
    for name in ("dev", "test"):
        (tmp_path / "coll").mkdir(exist_ok=True)
        shutil.copy(questions, tmp_path / "coll" / f"{name}.jsonl")
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=1)
    with pytest.raises(ValueError, match=r"dev\.jsonl and .*test\.jsonl would both be reported as dataset 'coll'"):
        evaluate([tmp_path / "coll" / "dev.jsonl", tmp_path / "coll" / "test.jsonl"], tmp_path / "out", settings)
    assert not (tmp_path / "out" / "results").exists()


def test_a_corpus_path_typo_is_refused_before_any_question_runs(synthetic, tmp_path):
    _, questions, rows = synthetic
    typo = tmp_path / "synth" / "corpsu.jsonl"
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(typo), modes=("parallel",), limit=2)
    with pytest.raises(ValueError, match=r"corpus file not found: .*corpsu\.jsonl \(expected a jsonl file"):
        evaluate([questions], tmp_path / "out", settings)
    assert not (tmp_path / "out" / "results").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("concurrency", 0, r"concurrency must be an integer of at least 1 .*got 0"),
        ("concurrency", -2, r"concurrency must be an integer of at least 1 .*got -2"),
        ("limit", 0, r"limit must be an integer of at least 1 .* or None \(all\), got 0"),
        ("limit", -1, r"limit must be an integer of at least 1 .* or None \(all\), got -1"),
        ("modes", "parallel", r"modes must be a non-empty list of parallel and sequential, got 'parallel'"),
    ],
)
def test_settings_out_of_bounds_are_refused(field, value, message, synthetic, tmp_path):
    with pytest.raises(ValueError, match=message):
        EvalSettings(**{field: value})
    settings = EvalSettings(retriever=str(synthetic[0]))
    setattr(settings, field, value)  # changed after construction: evaluate checks again
    with pytest.raises(ValueError, match=message):
        evaluate([synthetic[1]], tmp_path / "out", settings)


def test_a_torn_last_line_is_ended_before_the_rerun_appends(synthetic, tmp_path):
    corpus, questions, rows = synthetic
    out = tmp_path / "out"
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=2)
    evaluate([questions], out, settings)
    results = out / "results" / "synth.parallel.jsonl"
    first, second = results.read_text().splitlines()
    results.write_text(first + "\n" + second[: len(second) // 2])  # a crash in the middle of the second line
    summary = evaluate([questions], out, settings)
    lines = results.read_text().splitlines()
    assert lines[:2] == [first, second[: len(second) // 2]] and json.loads(lines[2])["id"] == json.loads(second)["id"]
    assert summary["overall"]["parallel"] | {"n": 2, "errors": 0} == summary["overall"]["parallel"]


def test_ids_of_a_file_without_ids_do_not_depend_on_how_its_path_is_spelled(synthetic, tmp_path, monkeypatch):
    corpus, _, rows = synthetic
    monkeypatch.chdir(tmp_path)
    Path("data.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "id"}) + "\n" for r in rows))
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=2)
    for spelling in ("data.jsonl", "./data.jsonl", str(tmp_path / "data.jsonl")):
        summary = evaluate([spelling], "out", settings)
    assert len(Path("out/results/data.parallel.jsonl").read_text().splitlines()) == 2
    assert summary["overall"]["parallel"]["n"] == 2


def test_a_lone_surrogate_or_non_utf8_line_is_skipped_and_the_rest_run(synthetic, tmp_path):
    corpus, questions, rows = synthetic
    good = questions.read_text().splitlines()[:2]
    data = tmp_path / "odd.jsonl"
    data.write_bytes(
        b"\n".join(
            [
                good[0].encode(),
                b'{"question": "\\ud800 who?", "golden_answers": ["a"]}',
                b'{"question": "caf\xe9?", "golden_answers": ["a"]}',
                b'{"question": "which?", "golden_answers": ["a"], "type": ["comparison"]}',
                good[1].encode(),
            ]
        )
        + b"\n"
    )
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",))
    summary = evaluate([data], tmp_path / "out", settings)
    assert summary["overall"]["parallel"] | {"n": 2, "errors": 0} == summary["overall"]["parallel"]
    assert [p.split(": ")[0] for p in summary["skipped_lines"]] == [f"{data}:{n}" for n in (2, 3, 4)]
    assert "Skipped data lines (3)" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow
def test_ps_agent_eval_end_to_end_with_the_embedded_model(synthetic, tmp_path, smollm2_path):
    corpus, questions, _ = synthetic
    out = tmp_path / "out"
    command = [
        PS_AGENT,
        "eval",
        "--data",
        str(questions),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--mode",
        "both",
        "--llm",
        "smollm2",
        "--limit",
        "2",
        "--max-turns",
        "1",
        "--max-new-tokens",
        "32",
        "--concurrency",
        "2",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    for mode in ("parallel", "sequential"):
        assert summary["overall"][mode]["n"] == 2 and summary["overall"][mode]["errors"] == 0
    assert (out / "report.md").read_text().strip() in run.stdout  # its markdown whole: it was wrapped at 80 columns
    assert (out / "plots.png").is_file() and (out / "report.html").is_file()
    (provenance,) = summary["runs"]  # what reproduces the numbers
    assert provenance["command"].endswith(shlex.join(command[1:]))
    assert provenance["data_sha1"] == {str(questions): hashlib.sha1(questions.read_bytes()).hexdigest()}
    assert provenance["settings"]["llm"] == "smollm2" and provenance["settings"]["agent"]["max_turns"] == 1
    shipped = Path(__file__).parents[1] / "policies" / "smollm2-parallelsearch" / "adapter_model.safetensors"
    assert provenance["model_sha1"][str(shipped)] == hashlib.sha1(shipped.read_bytes()).hexdigest()


def test_eval_over_a_built_index_folder(synthetic, tmp_path):
    from ps_agent.retrieval.index import build_index

    corpus, questions, rows = synthetic
    folder = tmp_path / "index"
    build_index(corpus, folder, ["bm25"], progress=False)
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(folder), modes=("parallel",), limit=4)
    summary = evaluate([questions], tmp_path / "out", settings)
    assert summary["overall"]["parallel"]["n"] == 4 and summary["overall"]["parallel"]["errors"] == 0
    assert summary["overall"]["parallel"]["em"] > 0  # the oracle's gold plans find their passages in the folder
    bad = subprocess.run(
        [PS_AGENT, "eval", "--data", str(questions), "--out", str(tmp_path / "o2"), "--index", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "not a built index: no manifest.json" in bad.stderr


def test_a_rerun_into_a_folder_answered_by_other_weights_is_refused_before_any_question_runs(synthetic, tmp_path):
    """A rerun skips the questions answered in its folder: answers of other weights would count as this model's."""
    corpus, questions, rows = synthetic
    checkpoint = tmp_path / "checkpoint-2"  # a served model's weights: they change while the folder's name stays
    checkpoint.mkdir()
    weights = checkpoint / "adapter_model.safetensors"
    weights.write_bytes(b"weights after step 2")

    def settings(limit: int, **weights) -> EvalSettings:  # an LLM object: evaluate() sees its weights if told
        return EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=limit,
                            **weights)  # fmt: skip

    out = tmp_path / "out"
    results = out / "results" / "synth.parallel.jsonl"
    evaluate([questions], out, settings(1, weights=[weights]))
    evaluate([questions], out, settings(2, weights=[weights]))  # the same weights resume
    answered = results.read_text()
    assert len(answered.splitlines()) == 2

    moved = tmp_path / "final" / "adapter_model.safetensors"  # the same weights elsewhere (another machine's copy)
    moved.parent.mkdir()
    moved.write_bytes(weights.read_bytes())
    evaluate([questions], out, settings(3, weights=[moved]))
    assert len(results.read_text().splitlines()) == 3
    answered = results.read_text()

    weights.write_bytes(b"weights after step 8")
    with pytest.raises(ValueError, match="holds answers of other model weights"):
        evaluate([questions], out, settings(4, weights=[weights]))
    assert results.read_text() == answered  # nothing lost or added

    unrecorded = tmp_path / "unrecorded"  # answered by an LLM whose weights were not given
    evaluate([questions], unrecorded, settings(1))
    with pytest.raises(ValueError, match="holds answers of weights not on record"):
        evaluate([questions], unrecorded, settings(2, weights=[weights]))
    assert len((unrecorded / "results" / "synth.parallel.jsonl").read_text().splitlines()) == 1


def test_a_rerun_into_a_folder_answered_with_other_settings_is_refused_before_any_question_runs(synthetic, tmp_path):
    """A rerun with --max-turns 1 into a folder answered with 10 reported both runs' answers as one run's."""
    corpus, questions, rows = synthetic
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(b"the same weights")

    def settings(limit: int, agent: dict, retriever=str(corpus)) -> EvalSettings:
        return EvalSettings(llm=GoldPlanPolicy(rows), retriever=retriever, modes=("parallel",), limit=limit,
                            agent=agent, weights=[weights])  # fmt: skip

    out = tmp_path / "out"
    results = out / "results" / "synth.parallel.jsonl"
    evaluate([questions], out, settings(2, {"max_turns": 10}))
    evaluate([questions], out, settings(3, {"max_turns": 10, "topk": 3}))  # topk 3 is the default: the same run
    answered = results.read_text()
    with pytest.raises(ValueError, match=r'holds answers given with other settings: agent .*"max_turns": 10.* \(now'):
        evaluate([questions], out, settings(4, {"max_turns": 1}))
    with pytest.raises(ValueError, match=r"other settings: retriever"):
        evaluate([questions], out, settings(4, {"max_turns": 10}, retriever="embedded"))
    assert results.read_text() == answered  # nothing run, nothing lost


def test_part_validation_runs_only_the_held_out_questions_and_a_rerun_on_another_part_is_refused(synthetic, tmp_path):
    """The documented command evaluated the shared files whole, the train part the policies learnt from included;
    and a folder filled under another split (its validation part held questions this one holds out) was resumed."""
    from ps_agent.questions import SPLIT, split_part

    corpus, questions, rows = synthetic

    def settings(part: str) -> EvalSettings:
        return EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), part=part)

    out = tmp_path / "out"
    evaluate([questions], out, settings("validation"))
    answered = [json.loads(line)["id"] for line in (out / "results" / "synth.parallel.jsonl").read_text().splitlines()]
    held_out = [row["id"] for row in rows if split_part(row["id"]) == "validation"]
    assert sorted(answered) == sorted(held_out) and 0 < len(held_out) < len(rows)
    with pytest.raises(ValueError, match=r'other settings: part "validation" \(now "all"\)'):
        evaluate([questions], out, settings("all"))
    runs = out / "runs.jsonl"
    first = json.loads(runs.read_text().splitlines()[0])
    assert first["settings"]["split"] == SPLIT
    del first["settings"]["split"]  # as a folder filled before MuSiQue's shared hops were held out records it
    runs.write_text(json.dumps(first) + "\n")
    with pytest.raises(ValueError, match=rf'other settings: split "id-hash" \(now "{SPLIT}"\)'):
        evaluate([questions], out, settings("validation"))
    with pytest.raises(ValueError, match=r"part must be one of all, train, validation, got 'test'"):
        settings("test")


def _answered_by(out: Path, questions: Path, llm: str) -> str:
    """``out`` as an eval of ``llm`` leaves it: one answer line and the run's provenance (no model run)."""
    from ps_agent.provenance import provenance

    results = out / "results" / "synth.parallel.jsonl"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"id": "0", "dataset": "synth", "mode": "parallel", "error": None}) + "\n")
    (out / "runs.jsonl").write_text(json.dumps(provenance(EvalSettings(llm=llm), [questions])) + "\n")
    return results.read_text()


@pytest.mark.parametrize(
    ("first", "then", "message"),
    [  # issue 27: both were accepted, and the second run reported the first model's answers as its own
        ("smollm2", "smollm2-base", r"holds answers of other model weights \(smollm2: .*smollm2-parallelsearch"),
        ("smollm2", "qwen0.5b", "holds answers of other model weights"),
        ("vllm:http://127.0.0.1:9/v1", "vllm:http://127.0.0.1:9/v1", r"weights are not on record \(pass --weights"),
        ("openai:gpt-4o-mini", "anthropic:claude-3-5-haiku-latest", r"other model weights \(openai:gpt-4o-mini"),
    ],
)
def test_an_eval_into_a_folder_answered_by_another_model_is_refused(first, then, message, synthetic, tmp_path):
    corpus, questions, _ = synthetic
    answered = _answered_by(tmp_path / "out", questions, first)
    with pytest.raises(ValueError, match=message):
        evaluate([questions], tmp_path / "out", EvalSettings(llm=then, retriever=str(corpus), modes=("parallel",)))
    assert (tmp_path / "out" / "results" / "synth.parallel.jsonl").read_text() == answered  # nothing run


def test_a_second_eval_into_a_folder_being_written_is_refused(synthetic, tmp_path):
    from ps_agent.provenance import writing_to

    corpus, questions, rows = synthetic
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=1)
    with writing_to(tmp_path / "out"), pytest.raises(ValueError, match=r"out is being written by another eval \(pid"):
        evaluate([questions], tmp_path / "out", settings)
    assert not (tmp_path / "out" / "results").exists()
    assert evaluate([questions], tmp_path / "out", settings)["overall"]["parallel"]["n"] == 1  # the folder is free


@pytest.mark.parametrize(
    ("weights", "message"),
    [("model.safetensors", "got one path"), (["missing/model.safetensors"], "no such file")],
)
def test_weights_that_name_no_files_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        EvalSettings(llm=None, weights=weights)


def test_a_full_disk_ends_the_eval_with_what_was_written_whole_and_the_rerun_resumes(synthetic, tmp_path, monkeypatch):
    """Issue 27: a full disk left a torn line and no report. Test double: ``os.write`` of the results file fails
    part-way with ENOSPC after two lines, as a full disk does."""
    import errno
    import os

    corpus, questions, rows = synthetic
    real_write, written = os.write, []

    def full_disk_write(fd, data):
        if data.startswith(b'{"id"'):  # a result line
            if len(written) >= 2:
                real_write(fd, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(data)
        return real_write(fd, data)

    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=5,
                            concurrency=1)  # fmt: skip
    monkeypatch.setattr(os, "write", full_disk_write)
    with pytest.raises(EvalFailed, match=r"No space left on device; the 2 result lines written so far are whole"):
        evaluate([questions], tmp_path / "out", settings)
    monkeypatch.setattr(os, "write", real_write)
    results = tmp_path / "out" / "results" / "synth.parallel.jsonl"
    assert [json.loads(line)["error"] for line in results.read_text().splitlines()] == [None, None]  # no torn line
    summary = evaluate([questions], tmp_path / "out", settings)  # space again: the rerun runs the other three
    assert summary["overall"]["parallel"]["n"] == 5 and len(results.read_text().splitlines()) == 5


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"max_turns": 0}, "max_turns must be an integer from 1 to 32"),
        ({"max_turn": 3}, "agent settings: .*unexpected keyword argument 'max_turn'"),
    ],
)
def test_bad_agent_settings_are_refused_before_the_output_folder_is_written(tmp_path, agent, message):
    """--max-turns 0 wrote the folder's lock and run record and started the progress bar, then failed."""
    with pytest.raises(ValueError, match=message):
        EvalSettings(llm="bogus", retriever="embedded", modes=("parallel",), agent=agent)


def test_a_question_file_changed_since_the_folder_answered_it_is_refused_after_a_run_on_another_set(
    synthetic, tmp_path, monkeypatch
):
    """Only the last run's files were checked, by path as typed: a run on another set in between, or the same
    file spelt another way, let the old answers (scored against the old golds) be reported as the new file's."""
    corpus, _, rows = synthetic
    first, other = tmp_path / "setA" / "questions.jsonl", tmp_path / "setB" / "questions.jsonl"
    first.parent.mkdir()
    other.parent.mkdir()
    first.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    other.write_text(json.dumps(rows[2]) + "\n")
    out = tmp_path / "out"

    def settings():
        return EvalSettings(
            llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), agent={"max_turns": 10}
        )

    evaluate([first], out, settings())
    evaluate([other], out, settings())
    first.write_text("".join(json.dumps(r | {"golden_answers": ["Something Else"]}) + "\n" for r in rows[:2]))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ValueError, match=r"setA/questions.jsonl \(its contents, since the folder's answers to 'setA'\)"
    ):
        evaluate([Path("./setB/../setA/questions.jsonl")], out, settings())


def test_the_class_table_counts_each_modes_questions_and_errors_on_its_own():
    """n was the larger mode's count and errors the sum over modes: "4 errors" beside n = 3."""
    rows = [result("hotpotqa", "parallel", "comparison", 1.0, True, 2, 1.0, error="RuntimeError: boom")] * 2
    rows += [result("hotpotqa", "parallel", "comparison", 1.0, True, 2, 1.0)]
    rows += [result("hotpotqa", "sequential", "comparison", 1.0, False, 3, 2.0, error="RuntimeError: boom")] * 2
    table = class_table(summarise_results([r | {"id": str(i)} for i, r in enumerate(rows)]))
    (row,) = table["rows"]
    named = dict(zip(table["header"], row, strict=True))
    assert (named["n (parallel)"], named["n (sequential)"]) == ("3", "2")
    assert (named["errors (parallel)"], named["errors (sequential)"]) == ("2", "2")


def test_a_line_written_before_a_metric_or_a_class_was_fixed_is_tabled_as_a_new_one_would_be(tmp_path):
    """Tables reused the EM a line was written with: '' scored 1 against NQ's "---" until it was fixed, and
    Bamboogle's untyped questions stayed single-hop in folders written before."""
    old = result("nq", "parallel", None, 1.0, False, 2, 1.0) | {"answer": "", "golden_answers": ["---"]}
    bamboogle = result("bamboogle", "parallel", None, 1.0, False, 3, 1.0)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "old.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(bamboogle) + "\n")
    summary = report(tmp_path)
    assert summary["by_dataset"]["nq"]["parallel"]["em"] == 0.0
    assert list(summary["by_class"]) == ["bamboogle/sequential", "nq/single-hop"]


def test_a_rerun_with_every_question_answered_loads_no_model(synthetic, tmp_path, monkeypatch):
    import ps_agent.eval

    corpus, questions, rows = synthetic
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), limit=2)
    evaluate([questions], tmp_path / "out", settings)
    loaded = []
    monkeypatch.setattr(ps_agent.eval, "check_llm", lambda *args: loaded.append(args))  # test double: counts loads
    summary = evaluate([questions], tmp_path / "out", settings)
    assert loaded == [] and summary["overall"]["parallel"]["n"] == 2
    settings.limit = 3  # one question left: the model is loaded for it
    evaluate([questions], tmp_path / "out", settings)
    assert len(loaded) == 1


def test_a_rerun_reads_each_results_file_once(synthetic, tmp_path, monkeypatch):
    """What was left to run was read from the results file twice: once to decide whether to load the model, and
    again before running (a results file grows with every question: the trajectories of each)."""
    import ps_agent.eval

    corpus, questions, rows = synthetic
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel", "sequential"), limit=2)
    evaluate([questions], tmp_path / "out", settings)
    read, finished_ids = [], ps_agent.eval.finished_ids
    monkeypatch.setattr(ps_agent.eval, "finished_ids", lambda path: read.append(path.name) or finished_ids(path))
    settings.limit = 3
    summary = evaluate([questions], tmp_path / "out", settings)
    assert sorted(read) == ["synth.parallel.jsonl", "synth.sequential.jsonl"]
    assert [summary["overall"][mode]["n"] for mode in settings.modes] == [3, 3]


def test_a_rerun_names_its_corpus_by_its_file_not_by_the_path_it_was_given(synthetic, tmp_path, monkeypatch):
    """A relative --corpus was compared as text: the same file named from another folder was refused, and another
    file of the same name in another folder was accepted, its answers reported as one run with the first's."""
    corpus, questions, rows = synthetic
    out = tmp_path / "out"

    def settings(retriever: str, limit: int) -> EvalSettings:
        return EvalSettings(llm=GoldPlanPolicy(rows), retriever=retriever, modes=("parallel",), limit=limit)

    monkeypatch.chdir(corpus.parent)
    evaluate([questions], out, settings(corpus.name, 2))
    monkeypatch.chdir(tmp_path)
    evaluate([questions], out, settings(str(corpus), 3))  # the same file, by its absolute path: the same run
    other = tmp_path / "elsewhere" / corpus.name
    other.parent.mkdir()
    other.write_text(corpus.read_text().splitlines()[0] + "\n")
    monkeypatch.chdir(other.parent)
    with pytest.raises(ValueError, match=r"other settings: retriever"):
        evaluate([questions], out, settings(corpus.name, 4))
    corpus.write_text(corpus.read_text() + other.read_text())  # the same path, other contents
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"other settings: retriever_sha1"):
        evaluate([questions], out, settings(str(corpus), 4))


def test_a_part_that_holds_none_of_a_files_questions_is_refused_before_anything_runs(synthetic, tmp_path):
    corpus, _, rows = synthetic
    train_only = tmp_path / "train_only.jsonl"
    train_only.write_text("".join(json.dumps(r) + "\n" for r in rows if row_part(r) == "train"))
    settings = EvalSettings(llm=GoldPlanPolicy(rows), retriever=str(corpus), modes=("parallel",), part="validation")
    with pytest.raises(ValueError, match=r"train_only\.jsonl holds no question in the validation part to run"):
        evaluate([train_only], tmp_path / "out", settings)
    assert not (tmp_path / "out" / "runs.jsonl").exists()
