"""Curves of GRPO runs from their logs: rewards by component, dead groups before and after dynamic sampling,
split shares, over- and under-search rates, think length and rollout time, per optimizer step; each run's pace
(steps per hour, rollouts' share); and what splitting earned within a group, by question class.

    python benchmarks/grpo_runs.py --run grpo-parallel=runs/grpo-parallel --run grpo-sequential=runs/grpo-sequential

Each run folder's newest ``checkpoint-*/trainer_state.json`` holds TRL's log history; ``trajectories-*.jsonl`` the
rollouts. ``NAME=RUN_DIR/checkpoint-N`` reads a run up to that checkpoint (to set a longer run beside shorter ones).
Writes ``benchmarks/results/grpo_runs.{json,md}`` and ``figures/grpo_runs.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import figure  # noqa: E402
from ps_agent.episodes import summarise_rollouts  # noqa: E402
from ps_agent.trajectories import read_trajectories  # noqa: E402

KEYS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "outcome": "rewards/outcome_reward/mean",
    "decomposition": "rewards/decomposition_reward/mean",
    "search_count": "rewards/search_count_reward/mean",
    "format": "rewards/format_reward/mean",
    "dead_groups_before": "rollout/frac_reward_zero_std_before",
    "dead_groups_after": "frac_reward_zero_std",
    "decomposed_parallelisable": "rollout/decomposed_frac/parallelisable",
    "decomposed_sequential": "rollout/decomposed_frac/sequential",
    "format_valid": "rollout/format_valid_frac",
    "over_search": "rollout/over_search_frac",  # more search rounds than the question's class needs (HiPRAG)
    "under_search": "rollout/under_search_frac",  # fewer
    "think_words": "rollout/think_words",
    "rollout_s": "rollout/seconds",
    "rollout_tokens_per_s": "rollout/kept_tokens_per_s",
    "step_time_s": "step_time",
    "kl": "kl",  # with --beta: KL to the reference (for an --init_adapter run, the initial adapter)
    "teacher_kl": "teacher/kl",  # with --teacher (DGPO): KL to the teacher on the guided rollouts' tokens
    "teacher_guided": "teacher/guided_frac",
}


def curves(folder: Path) -> dict:
    if (folder / "trainer_state.json").is_file():  # a checkpoint: the run up to it
        checkpoints, folder = [folder], folder.parent
    else:
        checkpoints = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not checkpoints:
        raise SystemExit(f"{folder} has no checkpoint-*/trainer_state.json")
    state = json.loads((checkpoints[-1] / "trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "reward" in e]
    records = [r for r in read_trajectories(folder) if r["step"] < state["global_step"]]
    return {
        "checkpoint": str(checkpoints[-1]),
        "steps": [{"step": e["step"]} | {k: e.get(v) for k, v in KEYS.items()} for e in steps],
        "rollouts": summarise_rollouts(records),
    }


def pace(steps: list[dict]) -> dict:
    """How fast a run trained: the median seconds per optimizer step (the first left out: it loads and warms
    up), steps per hour at that pace, and the share of step time spent generating rollouts."""
    timed = [s for s in steps if s["step_time_s"] is not None]
    if not timed:
        return {}
    median = statistics.median(s["step_time_s"] for s in timed[1:] or timed)
    rolled = [s for s in timed if s["rollout_s"] is not None]  # a step without rollout time is not one of 0 s
    share = sum(s["rollout_s"] for s in rolled) / sum(s["step_time_s"] for s in rolled) if rolled else None
    return {"steps": len(timed), "median_step_s": median, "steps_per_hour": 3600 / median, "rollout_share": share}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR, repeatable")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grpo_runs")
    args = parser.parse_args()
    runs = {name: curves(Path(folder)) for name, _, folder in (r.partition("=") for r in args.run)}
    for run in runs.values():
        run["pace"] = pace(run["steps"])
    result = {"command": "python benchmarks/grpo_runs.py " + " ".join(sys.argv[1:]), "runs": runs}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# GRPO runs, per optimizer step\n\n`{result['command']}`\n"]
    lines += ["| run | steps | s/step (median after the first) | steps/hour | rollouts' share of step time |",
              "|---|---|---|---|---|"]  # fmt: skip
    for name, run in runs.items():
        p = run["pace"]
        cells = (
            f"{p['steps']} | {p['median_step_s']:.0f} | {p['steps_per_hour']:.1f} | "
            + ("–" if p["rollout_share"] is None else f"{p['rollout_share']:.0%}")
            if p
            else "0 | – | – | –"
        )
        lines.append(f"| {name} | {cells} |")
    lines.append("")
    cols = ["step", "reward", "outcome", "decomposition", "search_count", "format", "dead_groups_before",
            "dead_groups_after", "decomposed_parallelisable", "decomposed_sequential", "over_search",
            "under_search", "think_words", "rollout_s", "step_time_s"]  # fmt: skip
    for logged in (["kl"], ["teacher_kl", "teacher_guided"]):  # only where some run has the term
        if any(row[logged[0]] is not None for run in runs.values() for row in run["steps"]):
            cols += logged
    for name, run in runs.items():
        lines += [f"## {name} ({run['checkpoint']})\n", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for row in run["steps"]:
            lines.append("| " + " | ".join("" if row[c] is None else f"{row[c]:.3g}" for c in cols) + " |")
        advantage = run["rollouts"].get("split_advantage", {})
        earned = "; ".join(
            f"{c} {a['total']:+.2f}, {a['outcome']:+.2f} (n={a['groups']})" for c, a in advantage.items()
        )
        lines.append(
            "\nWhat splitting earned (mean reward of a group's split rollouts minus its whole ones; total, outcome): "
            + (earned or "no group held both split and whole rollouts")
        )
        lines.append("")
    args.out.with_suffix(".md").write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ("reward", "outcome", "dead_groups_before", "decomposed_parallelisable")
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2))
    for ax, key in zip(axes, panels, strict=True):
        for name, run in runs.items():
            points = [(r["step"], r[key]) for r in run["steps"] if r[key] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=name)
        ax.set_title(key)
        ax.set_xlabel("optimizer step")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(figure(args.out), dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
