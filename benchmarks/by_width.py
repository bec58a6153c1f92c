"""EM and splits on the held-out synthetic comparisons by width (the entities compared), beside chance.

    python benchmarks/by_width.py --sets runs/compare-wide/sets \
        --run sft=runs/compare-wide/sft-parallel --run grpo=runs/compare-wide/grpo-parallel-wide \
        --out benchmarks/results/by_width_wide

Every ``--run NAME=DIR[:MODE]`` is an eval folder of ``grpo_compare.py`` (or ``ps-agent eval``) that answered
``SETS/synthetic/questions.jsonl``, whose rows carry their width ``k``. A k-entity comparison is answered by
naming one of its k entities, so an agent that never reads a passage scores 1/k: where a policy's EM on wide
comparisons is near that, splitting them does not pay in outcome reward, and GRPO learns to stop splitting.
Writes ``OUT.md`` and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import Run  # noqa: E402
from ps_agent.episodes import scored  # noqa: E402
from ps_agent.metrics import mean  # noqa: E402

BANDS = ((2, 2), (3, 3), (4, 5), (6, 8))


def widths(sets: Path) -> dict[str, int]:
    """Width by question id of the synthetic comparisons in ``SETS/synthetic/questions.jsonl``."""
    path = sets / "synthetic" / "questions.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} is absent: expected the --sets folder of a grpo_compare.py run")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r["k"] for r in rows if r.get("type") == "comparison"}


def table(records: list[dict[str, Any]], k_of: dict[str, int]) -> list[dict[str, Any]]:
    """Per width band: questions, EM, share split, sub-queries in the first search round, and chance EM."""
    rows = []
    for low, high in BANDS:
        part = [r for r in records if low <= k_of.get(r["id"], 0) <= high]
        ran = [r for r in part if r["error"] is None]  # what the agent did, over the questions whose run ended
        first = [r["sub_queries_per_round"][0] if r["sub_queries_per_round"] else 0 for r in ran]
        rows.append({
            "k": str(low) if low == high else f"{low}-{high}",
            "n": len(part),
            "em": mean([scored(r, "em") for r in part]),
            "split": mean([float(r["decomposed"]) for r in ran]),
            "first_round_sub_queries": mean(first),
            "chance_em": mean([1 / k_of[r["id"]] for r in part]),
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=Path, required=True, help="the sets/ folder of a grpo_compare.py run")
    parser.add_argument("--run", action="append", required=True, help="NAME=DIR[:MODE], repeatable")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "by_width")
    args = parser.parse_args()
    k_of = widths(args.sets)
    runs = [Run.parse(text) for text in args.run]
    result = {
        "command": "python benchmarks/by_width.py " + " ".join(sys.argv[1:]),
        "runs": {run.name: table([r for r in run.records() if r["dataset"] == "synthetic"], k_of) for run in runs},
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")

    def fmt(value: float | None, percent: bool = True) -> str:
        return "" if value is None else (f"{100 * value:.0f}" if percent else f"{value:.1f}")

    lines = [
        "# Held-out synthetic comparisons by width\n",
        f"`{result['command']}`\n",
        "| model | entities | n | EM % | chance EM % | split % | sub-queries, first round |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["runs"].items():
        for r in rows:
            lines.append(
                f"| {name} | {r['k']} | {r['n']} | {fmt(r['em'])} | {fmt(r['chance_em'])} | {fmt(r['split'])} | "
                f"{fmt(r['first_round_sub_queries'], percent=False)} |"
            )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
