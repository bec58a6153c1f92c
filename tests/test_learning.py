"""benchmarks/learning.py's ratio of LLM calls, parallel over sequential mode, from hand-made result lines."""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("learning", Path(__file__).parents[1] / "benchmarks" / "learning.py")
learning = sys.modules["learning"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)


def result(qid, mode, calls, error=None):
    return {"id": qid, "dataset": "hotpotqa", "policy": "trained", "mode": mode, "llm_calls": calls,
            "question_class": "parallelisable", "error": error}  # fmt: skip


def test_the_calls_ratio_is_over_the_questions_both_modes_ran():
    """Each mode was averaged over its own questions: q2's parallel run errored, and the ratio was 0.44, not 2/3."""
    records = [result("q1", "parallel", 2), result("q1", "sequential", 3), result("q2", "sequential", 6)]
    records.append(result("q2", "parallel", 0, error="AgentError: timeout"))
    assert learning.calls_ratio(records) == {"hotpotqa": 2 / 3}
    assert learning.calls_ratio(records[1:]) == {"hotpotqa": None}  # no question both ran
