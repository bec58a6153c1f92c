"""benchmarks/policy_table.py: per policy, set and class, EM with a bootstrap interval, the split share, the share
searched in two or more rounds, and a markdown row per group that names the device its seconds were measured on."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ps_agent.questions import SHARED_DATA, read_split

spec = importlib.util.spec_from_file_location(
    "policy_table", Path(__file__).parents[1] / "benchmarks" / "policy_table.py"
)
policy_table = sys.modules["policy_table"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy_table)


def result(em, rounds, decomposed, cls, dataset="hotpotqa"):
    return {
        "dataset": dataset, "question_class": cls, "em": em, "f1": em, "cover_em": em, "decomposed": decomposed,
        "search_rounds": rounds, "llm_calls": rounds + 1, "latency_s": 3.0, "format_valid": True,
        "forced_answer": False, "rewards": {"total": em}, "error": None,
    }  # fmt: skip


def test_rows_count_em_splits_and_second_rounds_per_set_and_class():
    records = [
        result(1.0, 1, True, "parallelisable"),
        result(0.0, 1, True, "parallelisable"),
        result(1.0, 2, False, "sequential"),
        result(0.0, 1, False, "sequential"),
    ]
    rows = {(r["dataset"], r["class"]): r for r in policy_table.rows("p", records, 200)}
    assert set(rows) == {("hotpotqa", "all"), ("hotpotqa", "parallelisable"), ("hotpotqa", "sequential")}
    par, seq, everything = rows["hotpotqa", "parallelisable"], rows["hotpotqa", "sequential"], rows["hotpotqa", "all"]
    assert (par["n"], par["em"], par["split"], par["two_rounds"]) == (2, 50.0, 100.0, 0.0)
    assert (seq["split"], seq["two_rounds"], seq["llm_calls"]) == (0.0, 50.0, 2.5)
    assert everything["n"] == 4 and 0.0 <= everything["em_low"] <= 50.0 <= everything["em_high"] <= 100.0
    page = policy_table.markdown(
        [par | {"device": "cuda (H100)"}], "cmd", {"p": "policy_table.py --policy p=x:parallel"}
    )
    assert "- p: `policy_table.py --policy p=x:parallel`" in page
    line = page.splitlines()[-1]
    assert line.startswith("| p | hotpotqa | parallelisable | 2 | 50.0 [") and "3.0 (cuda (H100))" in line
    assert "ended in an error" not in page
    page = policy_table.markdown([], "cmd", {}, {"p": ["hotpotqa q7: AgentError: run_timeout_s=600 reached"]})
    assert "- p: hotpotqa q7: AgentError: run_timeout_s=600 reached" in page  # named, not hidden


def test_yes_no_questions_are_counted_by_gold_and_by_what_was_answered():
    """A policy that answers yes to every yes/no question scores the share of yes golds: the section shows it."""
    records = [
        result(1.0, 1, True, "parallelisable") | {"golden_answers": ["yes"], "answer": "Yes"},
        result(0.0, 1, True, "parallelisable") | {"golden_answers": ["no"], "answer": "yes"},
        result(0.0, 1, True, "parallelisable") | {"golden_answers": ["no"], "answer": "Lake Worth Lagoon"},
        result(1.0, 1, True, "parallelisable", "2wikimultihopqa") | {"golden_answers": ["No"], "answer": "no."},
        result(1.0, 1, True, "parallelisable") | {"golden_answers": ["Elle"], "answer": "Elle"},  # not yes/no
    ]
    table = policy_table.yes_no_answers("p", records)
    assert [(r["dataset"], r["yes"], r["no"]) for r in table] == [
        ("2wikimultihopqa", {}, {"no": 1}),
        ("hotpotqa", {"yes": 1}, {"yes": 1, "other": 1}),
    ]
    page = policy_table.yes_no_markdown(table)
    assert "| p | hotpotqa | 1: 1 / 0 / 0 | 2: 1 / 0 / 1 |" in page
    assert "| p | 2wikimultihopqa | 0: 0 / 0 / 0 | 1: 0 / 1 / 0 |" in page
    assert policy_table.yes_no_markdown([]) == ""


@pytest.mark.parametrize("bad", ["noequals", "x=qwen0.5b-parallelsearch", "x=spec:fast"])
def test_a_bad_policy_argument_says_what_was_expected(bad):
    with pytest.raises(SystemExit, match="expected NAME=SPEC:MODE"):
        policy_table.parse_policy(bad)


def test_a_folder_filled_on_a_gpu_then_resumed_on_a_cpu_names_each_sets_device_and_both_commands(tmp_path):
    """One eval folder answered HotpotQA on a GPU and MuSiQue on this CPU: each set keeps its own device and
    precision (one device for the folder labelled the GPU's seconds as the CPU's; no precision hid a bfloat16 run
    resumed in float32), and the page lists both commands."""
    import json

    folder = tmp_path / "qwen-v2"
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "hotpotqa.parallel.jsonl").write_text("{}\n")
    (folder / "device.txt").write_text("cuda")  # as an older policy_table left it
    assert policy_table.recorded_devices(folder) == {"hotpotqa": "cuda bfloat16"}  # as the script ran it then
    policy_table.record_devices(folder, ["musique"], "cpu")
    assert policy_table.recorded_devices(folder) == {"hotpotqa": "cuda bfloat16", "musique": "cpu float32"}
    policy_table.record_devices(folder, ["hotpotqa"], "cuda")  # the same device and precision, named once
    assert policy_table.recorded_devices(folder) == {"hotpotqa": "cuda bfloat16", "musique": "cpu float32"}
    policy_table.record_devices(folder, ["hotpotqa", "musique"], "vllm-cpu")  # resumed on another device
    both = {"hotpotqa": "cuda bfloat16 + vllm-cpu float32", "musique": "cpu float32 + vllm-cpu float32"}
    assert policy_table.recorded_devices(folder) == both
    policy_table.record_devices(folder, ["musique"], "cuda")  # resumed on a GPU, in bfloat16
    both["musique"] += " + cuda bfloat16"
    assert policy_table.recorded_devices(folder) == both
    policy_table.record_devices(folder, ["musique"], "cuda")  # a device named once
    assert policy_table.recorded_devices(folder) == both
    assert policy_table.answered(folder) == {"hotpotqa": 1}
    runs = [{"command": f"/x/benchmarks/policy_table.py --sets {s}"} for s in ("hotpotqa", "musique", "hotpotqa")]
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert policy_table.commands(folder) == [
        "python benchmarks/policy_table.py --sets hotpotqa",
        "python benchmarks/policy_table.py --sets musique",
    ]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("v2=hf:runs/sft/final", ("v2", "hf:runs/sft/final", "parallel")),  # the spec's own colon is not a mode
        ("v2=hf:runs/sft/final:sequential", ("v2", "hf:runs/sft/final", "sequential")),
        ("sft=qwen0.5b-parallelsearch", ("sft", "qwen0.5b-parallelsearch", "parallel")),
    ],
)
def test_a_benchmark_with_a_default_mode_takes_a_policy_without_one(text, parsed):
    assert policy_table.parse_policy(text, default_mode="parallel") == parsed


def test_a_policy_without_a_mode_is_refused_where_the_benchmark_has_no_default():
    with pytest.raises(SystemExit, match=r"expected NAME=SPEC:MODE, MODE parallel or sequential"):
        policy_table.parse_policy("v2=hf:runs/sft/final")
    with pytest.raises(SystemExit, match=r"or NAME=SPEC for parallel"):
        policy_table.parse_policy("=qwen0.5b-parallelsearch", default_mode="parallel")


@pytest.mark.slow
@pytest.mark.xdist_group("vllm-cpu")  # with the other vllm-cpu tests: one worker builds the server's virtualenv
@pytest.mark.timeout(900)
def test_a_policy_served_by_vllm_cpu_answers_with_its_trained_weights_then_its_server_and_weights_go(
    vllm_server, tmp_path
):
    """--device vllm-cpu (benchmarks/eval_backends.py over policy_table's evaluation): the shipped SmolLM2 policy,
    merged and served by its own real vllm-cpu server, answers held-out synthetic comparisons in the protocol its
    adapter taught; the server and the merged weights are gone after."""
    import argparse
    import subprocess

    from benchmarks.eval_backends import measure

    args = argparse.Namespace(
        policy="smollm2-parallelsearch:parallel", sets="synthetic", classes="parallelisable", limit=2,
        devices="vllm-cpu", concurrency=2, max_new_tokens=96, run_dir=tmp_path,
    )  # fmt: skip
    assert [(row["device"], row["questions"]) for row in measure(args)["rows"]] == [("vllm-cpu", 2)]
    (results,) = sorted((tmp_path / "vllm-cpu" / "results").glob("*.jsonl"))
    served = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["id"] for r in served) == ["synth-7-0", "synth-7-1"]
    assert [r["format_valid"] for r in served] == [True, True]
    assert any(r["sub_queries_per_round"][0] == 2 for r in served)  # split, as the adapter taught it
    assert not (tmp_path / "vllm-cpu" / "served-model").exists()  # the merged weights were removed
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "vllm-cpu" / "served-model")], capture_output=True)
    assert left.stdout == b""  # and no server process of them is left


def test_sets_keep_the_tables_and_the_pooled_paper_rows_to_the_datasets_named(tmp_path, monkeypatch):
    """--tables-only --sets hotpotqa over eval folders that also hold MuSiQue lines: the policy rows and the paper
    tables' pooled rows cover HotpotQA alone, as the evaluation would have. --classes and --limit keep the tables to
    the questions they name (they limited the evaluation only), an errored question scores 0 (it was left out, so a
    run gained by failing), and the tables compare the questions every policy was asked."""
    validation = read_split(SHARED_DATA / "hotpotqa" / "dev.jsonl", "validation")
    hotpotqa = [r["id"] for r in validation if r["type"] == "comparison"]
    musique = [r["id"] for r in read_split(SHARED_DATA / "musique" / "dev.jsonl", "validation")]
    for name, ems in (("ours", [1.0, 1.0, 1.0, 0.0, 0.0]), ("sft", [0.0, 1.0, 1.0, 0.0, 1.0])):
        ids = [("hotpotqa", hotpotqa[0]), ("hotpotqa", hotpotqa[1]), ("hotpotqa", hotpotqa[2])]
        ids += [("musique", musique[0]), ("musique", musique[1])]
        lines = [
            result(em, 1, True, "parallelisable", dataset)
            | {"id": qid, "mode": "parallel", "question": f"question {qid}", "golden_answers": ["a"], "answer": "a"}
            for em, (dataset, qid) in zip(ems, ids, strict=True)
        ]
        lines[4] |= {"error": "RuntimeError: boom"}  # a MuSiQue question whose run failed
        if name == "ours":
            lines[1] |= {"error": "RuntimeError: timeout", "em": 0.0}  # scored 0, not left out
        else:
            del lines[2]  # asked of ours only: out of the paper tables, which compare the same questions
        (tmp_path / name / "results").mkdir(parents=True)
        (tmp_path / name / "results" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        (tmp_path / name / "runs.jsonl").write_text(
            json.dumps({"command": "benchmarks/policy_table.py --nq 100"}) + "\n"
        )

    def tables(*extra: str) -> tuple[list[dict], dict]:
        out = tmp_path / "table"
        argv = ["policy_table.py", "--tables-only", "--run-dir", str(tmp_path), "--out", str(out), "--policy",
                "ours=x:parallel", "--policy", "sft=y:parallel", "--bootstrap", "200", *extra]  # fmt: skip
        monkeypatch.setattr(sys, "argv", argv)
        policy_table.main()
        rows = json.loads(out.with_suffix(".json").read_text())["rows"]
        return rows, json.loads(out.with_name("table_paper.json").read_text())

    rows, paper = tables("--sets", "hotpotqa", "--ours", "ours", "--baseline", "sft")
    assert {(r["policy"], r["dataset"]) for r in rows} == {("ours", "hotpotqa"), ("sft", "hotpotqa")}
    ours = next(r for r in rows if (r["policy"], r["class"]) == ("ours", "all"))
    assert (ours["n"], ours["em"]) == (3, pytest.approx(200 / 3))  # the timed-out question counts 0
    assert paper["pooled"]["all"]["ours"]["n"] == 2 and paper["pooled"]["all"]["ours"]["em"] == 50.0
    assert paper["runs"]["ours"]["not_shared"] == 1 and paper["runs"]["sft"]["not_shared"] == 0
    assert paper["ours_vs_baseline"]["every set/parallelisable"]["n"] == 2
    assert "--sets hotpotqa" in paper["command"] and "--seed 0" in paper["command"]
    assert "boom" not in (tmp_path / "table.md").read_text()  # nor are another set's failed questions listed
    assert "boom" not in (tmp_path / "table_paper.md").read_text()  # in either page
    with pytest.raises(ValueError, match="share no question"):  # HotpotQA's lines here are all comparisons
        tables("--sets", "hotpotqa", "--classes", "sequential")
    assert json.loads((tmp_path / "table.json").read_text())["rows"] == []
    rows, _ = tables("--sets", "hotpotqa", "--classes", "parallelisable", "--limit", "1")  # its first question only
    assert {r["n"] for r in rows} == {1}


def test_a_cell_whose_every_run_errored_is_tabled_with_em_0():
    """aggregate() gave such a cell no EM, and rows() stopped with KeyError."""
    failed = result(1.0, 1, False, "sequential") | {"error": "RuntimeError: boom"}
    rows = {
        (r["dataset"], r["class"]): r
        for r in policy_table.rows("p", [result(1.0, 1, True, "parallelisable"), failed], 200)
    }
    seq = rows["hotpotqa", "sequential"]
    assert (seq["n"], seq["em"], seq["em_low"], seq["split"], seq["llm_calls"]) == (1, 0.0, 0.0, None, None)
    page = policy_table.markdown([seq | {"device": "cpu"}], "cmd", {"p": "x"})
    assert "| p | hotpotqa | sequential | 1 | 0.0 [0.0, 0.0] | 0.0 | – | – | – | – (cpu) | – | – |" in page


def test_yes_no_answers_are_read_as_em_reads_them():
    answers = ["Yes!", '"yes"', "yes", "No."]
    records = [result(1.0, 1, True, "parallelisable") | {"golden_answers": ["yes"], "answer": a} for a in answers]
    (row,) = policy_table.yes_no_answers("p", records)
    assert row["yes"] == {"yes": 3, "no": 1}


def test_an_eval_folder_is_keyed_to_the_weights_its_spec_loads_in_its_mode(qwen_path, tmp_path, monkeypatch):
    """A base's name runs its trained adapter, but only the base was checksummed: a folder filled by
    ``qwen0.5b`` resumed, as the same model, by ``qwen0.5b-base`` (or by a retrained adapter), and a sharded ``hf:``
    folder had no identity at all. The base comes before its adapter wherever each lives (here the adapters' folder
    sorts first: sorting whole paths put them first on CI's clone and last on this one)."""
    from benchmarks.common import weight_files
    from ps_agent.llms import policies_dir

    shipped = policies_dir()
    for name in ("qwen0.5b-parallelsearch", "qwen0.5b-searchr1"):
        (tmp_path / "a-policies").mkdir(exist_ok=True)
        (tmp_path / "a-policies" / name).symlink_to(shipped / name)
    (tmp_path / "z-cache" / "models").mkdir(parents=True)
    (tmp_path / "z-cache" / "models" / qwen_path.name).symlink_to(qwen_path)
    monkeypatch.setenv("PS_AGENT_POLICIES", str(tmp_path / "a-policies"))
    monkeypatch.setenv("PS_AGENT_CACHE", str(tmp_path / "z-cache"))
    names = {mode: [p.parent.name for p in weight_files("qwen0.5b", mode)] for mode in ("parallel", "sequential")}
    assert names == {"parallel": [qwen_path.name, "qwen0.5b-parallelsearch"],
                     "sequential": [qwen_path.name, "qwen0.5b-searchr1"]}  # fmt: skip
    assert weight_files("qwen0.5b", "parallel") == weight_files("qwen0.5b-parallelsearch", "sequential")
    assert [p.parent.name for p in weight_files("qwen0.5b-base", "parallel")] == [qwen_path.name]
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "pytorch_model.bin"):
        (sharded / name).write_bytes(b"weights")
    (sharded / "config.json").write_text("{}")
    assert [p.name for p in weight_files(f"hf:{sharded}", "parallel")] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "pytorch_model.bin"
    ]  # fmt: skip


def test_a_class_picks_a_sets_questions_as_evaluation_classes_them(tmp_path):
    """Bamboogle's rows name no type: evaluation reads them as compositional (sequential), the set filter read them
    as single-hop, so --classes sequential dropped all of them and --classes single-hop kept them."""
    from benchmarks.common import validation_sets

    sequential = validation_sets(tmp_path / "seq", nq=5, classes={"sequential"}, names=["bamboogle"])
    rows = [json.loads(line) for line in sequential["bamboogle"].read_text().splitlines()]
    assert len(rows) == len(read_split(SHARED_DATA / "bamboogle" / "dev.jsonl", "validation")) > 0
    assert "bamboogle" not in validation_sets(tmp_path / "one", nq=5, classes={"single-hop"}, names=["bamboogle"])


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--policy", "a=x:parallel", "--policy", "a=y:sequential"], "--policy a given twice"),
        (["--policy", "a=x:parallel", "--policy", "b=y:parallel", "--ours", "a", "--baseline", "a"],
         "--ours and --baseline are both 'a'"),
    ],
)  # fmt: skip
def test_two_policies_of_one_name_or_one_policy_against_itself_are_refused_before_evaluating(
    flags, refusal, tmp_path, monkeypatch, capsys
):
    """The table is keyed by name: the second policy of a name replaced the first, and --ours against itself
    compared one run with itself."""
    monkeypatch.setattr(sys, "argv", ["policy_table.py", "--tables-only", "--run-dir", str(tmp_path), *flags])
    with pytest.raises(SystemExit):
        policy_table.main()
    assert refusal in capsys.readouterr().err
