"""benchmarks/paper_table.py from hand-made eval folders: the Table 3 and Table 2 layouts, bootstrap intervals and
the paired comparison of ours against the baseline."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "paper_table", Path(__file__).parents[1] / "benchmarks" / "paper_table.py"
)
paper_table = sys.modules["paper_table"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up
spec.loader.exec_module(paper_table)


def line(qid, mode, em, calls, decomposed, cls="parallelisable", dataset="hotpotqa"):
    return {
        "id": qid,
        "dataset": dataset,
        "mode": mode,
        "question": f"question {qid}",
        "question_type": "comparison" if cls == "parallelisable" else "bridge",
        "question_class": cls,
        "golden_answers": ["a"],
        "answer": "a" if em else "b",
        "em": em,
        "f1": em,
        "cover_em": em,
        "rewards": {"total": em},
        "llm_calls": calls,
        "search_rounds": calls - 1,
        "decomposed": decomposed,
        "format_valid": True,
        "forced_answer": False,
        "latency_s": 2.0 * calls,
        "error": None,
    }


def eval_folder(root: Path, name: str, lines: list[dict]) -> Path:
    folder = root / name
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


@pytest.fixture
def runs(tmp_path):
    ours = [line(f"q{i}", "parallel", em, 2, True) for i, em in enumerate([1.0, 1.0, 0.0, 1.0])]
    ours += [line("s0", "parallel", 0.0, 3, False, cls="sequential")]
    ours += [line("q0", "sequential", 0.0, 9, False)]  # another mode's line: not this model's
    baseline = [line(f"q{i}", "sequential", em, 3, False) for i, em in enumerate([1.0, 0.0, 0.0, 1.0])]
    baseline += [line("n0", "sequential", 1.0, 2, False, cls="single-hop", dataset="nq")]
    baseline += [line("q9", "sequential", 1.0, 3, False) | {"error": "RuntimeError: boom", "em": 0.0}]
    return eval_folder(tmp_path, "ours", ours), eval_folder(tmp_path, "baseline", baseline)


def test_tables_intervals_and_the_paired_comparison(runs, tmp_path):
    ours, baseline = runs
    out = tmp_path / "table"
    argv = ["--run", f"ours={ours}", "--run", f"search-r1={baseline}:sequential", "--ours", "ours"]
    result = paper_table.main([*argv, "--baseline", "search-r1", "--bootstrap", "500", "--out", str(out)])
    cell = result["by_class"]["hotpotqa/parallelisable"]
    assert cell["ours"]["n"] == 4 and cell["ours"]["em"] == 75.0 and cell["ours"]["turns"] == 2.0
    assert cell["ours"]["decomposition_ratio"] == 100.0 and cell["search-r1"]["decomposition_ratio"] == 0.0
    # the tables compare the questions both were asked: ours' s0, the baseline's n0 and q9 (errored) are out
    assert cell["search-r1"]["n"] == 4
    assert {n: r["not_shared"] for n, r in result["runs"].items()} == {"ours": 1, "search-r1": 2}
    # q9 errored, but is not in the tables: the page listed it "(EM 0)" beside rows that do not count it
    assert result["runs"]["search-r1"]["errors"] == [] and not result["runs"]["ours"]["errors"]
    low, high = cell["ours"]["em_ci"]
    assert 0.0 <= low < 75.0 < high <= 100.0
    assert cell["ours"]["turns_ci"] == [2.0, 2.0]  # no spread, no interval
    paired = result["ours_vs_baseline"]["hotpotqa/parallelisable"]
    assert paired["n"] == 4 and paired["em_diff"] == 25.0 and paired["turns_ratio"] == pytest.approx(2 / 3)
    assert paired["turns_ratio_ci"] == pytest.approx([2 / 3, 2 / 3])  # every question: 2 turns vs 3
    assert paired["em_diff_ci"][0] <= 25.0 <= paired["em_diff_ci"][1] <= 100.0
    assert list(result["ours_vs_baseline"]) == ["hotpotqa/parallelisable", "every set/parallelisable"]
    assert set(result["by_dataset"]) == {"hotpotqa"}  # nq: the baseline's alone
    text = out.with_suffix(".md").read_text()
    assert "| hotpotqa/parallelisable | ours | 4 | 75.0 [" in text
    assert "hotpotqa q9" not in text  # errored, but not tabled: no "(EM 0)" beside rows that leave it out
    assert "left out: 2 questions not every run was asked" in text
    assert "| ours | 75.0 | 75.0 |" in text  # Table 2 over the shared questions
    assert (
        "| hotpotqa/parallelisable | 4 | 25.0 [" in text and (tmp_path / "figures" / "table.png").stat().st_size > 0
    )  # the figure beside the tables
    pooled = result["pooled"]  # Table 4: every dataset together, one line per model
    assert pooled["all"]["search-r1"]["n"] == 4 and pooled["all"]["search-r1"]["em"] == 50.0
    assert "| ours | 4 | 75.0 [" in text
    again = paper_table.main([*argv, "--baseline", "search-r1", "--bootstrap", "500", "--out", str(tmp_path / "b")])
    assert again["by_class"] == result["by_class"]  # seeded: the same intervals
    alone = paper_table.main(["--run", f"ours={ours}", "--bootstrap", "500", "--out", str(tmp_path / "c")])
    # each cell resampled on its own: a model's interval does not depend on the models drawn before it
    assert alone["by_class"]["hotpotqa/parallelisable"]["ours"] == cell["ours"]
    assert "--seed 0" in result["command"]


def test_an_errored_question_scores_0_in_the_tables_and_in_the_pair(tmp_path):
    """A run's errored questions were left out: 4 right of 24 with 20 timeouts was EM 100 in the tables (16.7 in
    the eval's own report), so a model that timed out more looked better."""
    ours = [line(f"q{i}", "parallel", 1.0, 2, True) for i in range(4)]
    ours += [line(f"q{i}", "parallel", 0.0, 2, True) | {"error": "AgentError: timeout"} for i in range(4, 24)]
    other = [line(f"q{i}", "sequential", 1.0 if i < 6 else 0.0, 3, False) for i in range(24)]
    folders = eval_folder(tmp_path, "ours", ours), eval_folder(tmp_path, "other", other)
    argv = ["--run", f"ours={folders[0]}", "--run", f"other={folders[1]}:sequential", "--ours", "ours"]
    result = paper_table.main([*argv, "--baseline", "other", "--bootstrap", "200", "--out", str(tmp_path / "t")])
    assert result["by_dataset"]["hotpotqa"]["ours"]["em"] == pytest.approx(100 * 4 / 24)
    pair = result["ours_vs_baseline"]["hotpotqa/parallelisable"]
    assert pair["n"] == 24 and pair["em_diff"] == pytest.approx(100 * (4 - 6) / 24)
    assert pair["turns_ratio"] == pytest.approx(2 / 3)  # over the 4 questions both ran


def test_sets_pool_only_the_datasets_named(runs, tmp_path):
    ours, baseline = runs
    argv = ["--run", f"ours={ours}", "--run", f"search-r1={baseline}:sequential", "--baseline", "search-r1"]
    out = tmp_path / "hotpot"
    result = paper_table.main([*argv, "--ours", "ours", "--sets", "hotpotqa", "--bootstrap", "500", "--out", str(out)])
    assert set(result["by_dataset"]) == {"hotpotqa"}  # nq's line is left out of every table
    assert result["pooled"]["all"]["search-r1"]["n"] == 4 and result["pooled"]["all"]["search-r1"]["em"] == 50.0
    assert result["runs"]["search-r1"]["not_shared"] == 1  # q9, asked of the baseline only
    assert "single-hop" not in result["pooled"]
    assert "--sets hotpotqa" in result["command"] and "--sets hotpotqa" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run", "ours"], "expected NAME=DIR"),
        (["--run", "ours=DIR:both"], "expected parallel or sequential"),
        (["--run", "ours=/nonexistent"], "has no results/ folder"),
        (["--run", "ours={ours}", "--ours", "ours", "--baseline", "sr1"], "--baseline 'sr1' is not a --run name"),
        (["--run", "ours={ours}", "--ours", "ours"], "give --ours and --baseline together"),
        (["--run", "ours={ours}", "--bootstrap", "10"], "at least 100"),
        (["--run", "ours={ours}", "--sets", "musique"], "run 'ours' has no line of these sets (it has: hotpotqa)"),
    ],
)
def test_bad_arguments_say_what_was_expected(runs, args, message, capsys):
    ours, _ = runs
    with pytest.raises(SystemExit) as exit_info:
        paper_table.main([a.format(ours=ours) for a in args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_comparison_refuses_an_eval_folder_of_other_weights_before_serving_any_policy(tmp_path, monkeypatch):
    """Eval resumes into a folder with results: grpo_compare's folder for a name must hold that very policy's,
    told apart by the weight files it is served from (a checkpoint's name stays while its weights change)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import grpo_compare

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "adapter_config.json").write_text("{}")
    (checkpoint / "adapter_model.safetensors").write_bytes(b"weights after step 8")
    folder = tmp_path / "compare" / "grpo-parallel"  # evaluated when checkpoint-2 held other weights
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "hotpotqa.parallel.jsonl").write_text('{"id": "q1", "em": 1.0}\n')
    (folder / "runs.jsonl").write_text(json.dumps({"settings": {"llm": "step 2"}, "model_sha1": {"a": "b"}}) + "\n")
    argv = ["grpo_compare.py", "--run-dir", str(tmp_path / "compare"), "--ours", "grpo-parallel", "--baseline", "b",
            "--policy", f"grpo-parallel={checkpoint}:parallel", "--policy", "b=base:sequential"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=r"--policy grpo-parallel: .* holds answers of other model weights"):
        grpo_compare.main()
    monkeypatch.setattr(sys, "argv", [*argv[:-2], "--policy", "c=base:sequential"])  # a --baseline typo
    with pytest.raises(SystemExit) as refused:  # a usage error before any evaluation (it failed after all of them)
        grpo_compare.main()
    assert refused.value.code == 2
    assert not (tmp_path / "compare" / "vllm-server.log").exists()  # refused before a server started


def test_a_cell_whose_every_run_errored_scores_0_and_shows_no_behaviour(tmp_path):
    """aggregate() left such a cell without EM: the page crashed (KeyError 'em') after writing its json."""
    ours = [line("q0", "parallel", 1.0, 2, True), line("s0", "parallel", 1.0, 3, False, cls="sequential")]
    failed = line("s0", "sequential", 1.0, 3, False, cls="sequential") | {"error": "RuntimeError: boom", "em": 0.0}
    base = [line("q0", "sequential", 1.0, 3, False), failed]
    out = tmp_path / "t"
    argv = [
        "--run",
        f"ours={eval_folder(tmp_path, 'ours', ours)}",
        "--run",
        f"base={eval_folder(tmp_path, 'base', base)}:sequential",
    ]
    result = paper_table.main([*argv, "--bootstrap", "200", "--out", str(out)])
    cell = result["by_class"]["hotpotqa/sequential"]["base"]
    assert (cell["n"], cell["errors"], cell["em"], cell["em_ci"]) == (1, 1, 0.0, [0.0, 0.0])
    assert result["runs"]["base"]["errors"] == ["hotpotqa s0: RuntimeError: boom"]
    assert "| hotpotqa/sequential | base | 1 | 0.0 [0.0, 0.0] | – | – | – |" in out.with_suffix(".md").read_text()


def test_intervals_do_not_depend_on_the_order_the_results_were_written_in(tmp_path):
    lines = [line(f"q{i}", "parallel", float(i % 3 == 0), 2 + i % 2, True) for i in range(12)]
    base = [line(f"q{i}", "sequential", float(i % 2 == 0), 3, False) for i in range(12)]
    results = []
    for order, root in ((1, tmp_path / "1"), (-1, tmp_path / "2")):  # as written, then reversed
        a, b = eval_folder(root, "a", lines[::order]), eval_folder(root, "b", base[::order])
        argv = ["--run", f"a={a}", "--run", f"b={b}:sequential", "--ours", "a", "--baseline", "b"]
        results.append(paper_table.main([*argv, "--bootstrap", "300", "--out", str(root / "t")]))
    key = "hotpotqa/parallelisable"
    assert results[0]["by_class"][key]["a"]["em_ci"] == results[1]["by_class"][key]["a"]["em_ci"]
    assert results[0]["ours_vs_baseline"][key]["em_diff_ci"] == results[1]["ours_vs_baseline"][key]["em_diff_ci"]


def test_a_base_asked_a_few_questions_a_set_is_tabled_apart_not_cutting_the_others_tables(tmp_path):
    """grpo_compare.py's untrained base answers the first --base-limit questions of each set: tabled beside the
    others, every table (the paired comparison included) shrank to its questions."""
    from benchmarks.common import Run
    from benchmarks.grpo_compare import tables

    ours = [line(f"q{i}", "parallel", float(i % 2), 2, True) for i in range(6)]
    ours += [line(f"s{i}", "parallel", 1.0, 3, False, cls="sequential") for i in range(3)]
    baseline = [line(f"q{i}", "sequential", 0.0, 3, False) for i in range(6)]
    baseline += [line(f"s{i}", "sequential", 1.0, 3, False, cls="sequential") for i in range(3)]
    base = [line(f"s{i}", "parallel", 0.0, 2, False, cls="sequential") for i in range(2)]  # its first two
    runs = [
        Run("ours", eval_folder(tmp_path, "ours", ours), "parallel"),
        Run("searchr1", eval_folder(tmp_path, "searchr1", baseline), "sequential"),
        Run("base", eval_folder(tmp_path, "base", base), "parallel"),
    ]
    tables(runs, {"base"}, "ours", "searchr1", 200, tmp_path / "t")
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["by_class"]["hotpotqa/parallelisable"]["ours"]["n"] == 6 and "base" not in result["runs"]
    assert result["ours_vs_baseline"]["hotpotqa/parallelisable"]["n"] == 6
    alone = json.loads((tmp_path / "t-base.json").read_text())
    assert alone["by_class"]["hotpotqa/sequential"]["base"]["n"] == 2
