"""benchmarks/grpo_runs.py's pace of a run, from hand-made per-step logs."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("grpo_runs", Path(__file__).parents[1] / "benchmarks" / "grpo_runs.py")
grpo_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_runs)


def step(n, step_time, rollout):
    return {"step": n, "step_time_s": step_time, "rollout_s": rollout}


def test_pace_leaves_out_the_warm_up_step_and_counts_the_rollouts_share():
    steps = [step(1, 300.0, 100.0), step(2, 40.0, 30.0), step(3, 60.0, 50.0), step(4, 50.0, 40.0)]
    pace = grpo_runs.pace([*steps, step(5, None, None)])  # a step logged without timing is not counted
    assert pace["steps"] == 4
    assert pace["median_step_s"] == 50.0  # of 40, 60, 50; the 300 s first step loads and warms up
    assert pace["steps_per_hour"] == 72.0
    assert pace["rollout_share"] == 220.0 / 450.0


def test_pace_of_a_single_step_and_of_an_untimed_run():
    assert grpo_runs.pace([step(1, 120.0, 60.0)])["median_step_s"] == 120.0
    assert grpo_runs.pace([step(1, None, None)]) == {}


def test_a_run_that_logged_no_rollout_time_has_no_rollout_share():
    """It was counted as 0 s of rollouts: "0%" instead of "–"."""
    assert grpo_runs.pace([step(1, 100.0, None), step(2, 50.0, None)])["rollout_share"] is None
    assert grpo_runs.pace([step(1, 100.0, None), step(2, 50.0, 25.0)])["rollout_share"] == 0.5  # of the timed
