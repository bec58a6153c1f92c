"""benchmarks/comparatives.py: the probe's questions ask for both extremes, in both name orders, and each one's
answer is the entity whose passage states that extreme."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "comparatives", Path(__file__).parents[1] / "benchmarks" / "comparatives.py"
)
comparatives = sys.modules["comparatives"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(comparatives)


def test_each_question_is_answered_by_the_passage_stating_the_extreme_it_asks_for():
    cases = comparatives.cases()
    assert len(cases) == 4 * len(comparatives.PAIRS)
    for case in cases:
        values = {}
        for line in case["corpus"]:
            title, text = line["contents"].split("\n", 1)
            values[title.strip('"')] = int(re.findall(r"\d[\d,]*\d", text)[-1].replace(",", ""))
        assert len(set(values.values())) == 2, case
        wanted = (max if case["wanted"] == "largest" else min)(values, key=values.get)
        assert case["answers"][0] == wanted, case
    asked = {(c["pair"], c["wanted"], c["question"].split(",")[1].strip()) for c in cases}
    assert len(asked) == len(cases)  # the names in both orders for each direction


def test_the_verdict_reader_names_the_extreme_or_none():
    assert comparatives.verdict_named("<think> The question asks for the largest. 8 > 6 </think>") == "largest"
    assert comparatives.verdict_named("<think> So the answer is K2. </think>") is None


def test_a_malformed_later_policy_is_refused_before_the_first_one_runs(tmp_path):
    script = Path(__file__).parents[1] / "benchmarks" / "comparatives.py"
    done = subprocess.run(
        [sys.executable, str(script), "--policy", f"first=hf:{tmp_path / 'missing'}", "--policy", "second",
         "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--policy 'second': expected NAME=SPEC" in done.stderr  # the second is read first: the first never loads
    assert "model path not found" not in done.stderr
