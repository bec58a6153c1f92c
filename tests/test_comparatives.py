"""benchmarks/comparatives.py: the probe's questions ask for both extremes, in both name orders, and each one's
answer is the entity whose passage states that extreme."""

import importlib.util
import re
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
