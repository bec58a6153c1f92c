"""Learning check: GRPO on SmolLM2-135M (LoRA, CPU) for a fixed time, and whether it learns to decompose.

    python benchmarks/grpo_check.py [--minutes 60] [--questions 48]

Trains on a balanced sample of comparison (parallelisable) and bridge (sequential) questions: by default
2-way comparisons and 2-hop bridges of the synthetic world (``--source synthetic``), or
../shared/data/hotpotqa/dev.jsonl with its corpus (``--source hotpotqa``), each searched with BM25.
Reads the run's trajectory log and writes, per step, the total reward and each component, the
decomposition ratio on parallelisable and on sequential questions, search rounds, format validity and
forced answers to benchmarks/results/grpo_check.json, with curves in figures/grpo_check.png and a summary in
grpo_check.md. The check: rewards and decomposition of parallelisable questions rise over the run while
false decompositions of sequential questions do not.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import TrainerCallback  # noqa: E402

from benchmarks.common import figure  # noqa: E402
from ps_agent.episodes import summarise_rollouts  # noqa: E402
from ps_agent.metrics import mean  # noqa: E402
from ps_agent.questions import SHARED_DATA, read_split  # noqa: E402
from ps_agent.synthetic import generate  # noqa: E402
from ps_agent.trajectories import read_trajectories  # noqa: E402
from training.data import load_questions  # noqa: E402
from training.run_grpo import main as run_grpo  # noqa: E402

SHARED = SHARED_DATA / "hotpotqa"
RESULTS = ROOT / "benchmarks" / "results"


class TimeBudget(TrainerCallback):
    """Stops training once ``minutes`` have passed (checked after each step)."""

    def __init__(self, minutes: float) -> None:
        self.deadline = time.monotonic() + 60 * minutes

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() > self.deadline:
            control.should_training_stop = True
        return control


def training_questions(n: int, seed: int, out: Path, source: str) -> tuple[str, str | None]:
    """A balanced jsonl sample (half comparison, half bridge), and the corpus to search."""
    if source == "synthetic":
        corpus, questions = generate(seed, 400, out / "synth", per_family=n)
        rows = [json.loads(line) for line in questions.read_text().splitlines()]
        rows = [r for r in rows if (r["family"], r["k"], r["depth"]) in {("comparison", 2, 1), ("bridge", 1, 2)}]
    elif (SHARED / "dev.jsonl").is_file():
        corpus = SHARED / "corpus.jsonl"
        rows = read_split(SHARED / "dev.jsonl", "train")  # the validation part is for reporting only
    else:
        return "builtin", None
    rng = random.Random(seed)
    sample = []
    for kind in ("comparison", "bridge"):
        of_kind = [r for r in rows if r["type"] == kind]
        sample += rng.sample(of_kind, n // 2)
    rng.shuffle(sample)
    path = out / "questions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in sample))
    return str(path), str(corpus)


def curves(records: list[dict]) -> list[dict]:
    """Per-step means of the logged rollouts (``episodes.summarise_rollouts`` of each step)."""
    rows = []
    for step in sorted({r["step"] for r in records}):
        summary = summarise_rollouts([r for r in records if r["step"] == step])
        rows.append(
            {"step": step, "rollouts": summary["rollouts"]}
            | {f"reward/{k}": v for k, v in summary["rewards"].items()}
            | {f"decomposed/{c}": summary["decomposed_by_class"].get(c) for c in ("parallelisable", "sequential")}
            | {k: summary[k] for k in ("search_rounds", "format_valid", "forced_answer")}
        )
    return rows


def thirds(rows: list[dict], key: str) -> tuple[float | None, float | None]:
    """Mean of ``key`` over the first and the last third of the steps."""
    values = [r[key] for r in rows if r[key] is not None]
    if len(values) < 3:
        return None, None
    third = len(values) // 3
    return mean(values[:third]), mean(values[-third:])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for k in ("total", "outcome", "decomposition", "search_count", "format"):
        axes[0].plot(steps, [r[f"reward/{k}"] for r in rows], label=k)
    axes[0].set_title("reward (mean per step)")
    for cls in ("parallelisable", "sequential"):
        axes[1].plot(steps, [r[f"decomposed/{cls}"] for r in rows], marker=".", label=cls)
    axes[1].set_title("decomposition ratio")
    for k in ("format_valid", "forced_answer", "search_rounds"):
        axes[2].plot(steps, [r[k] for r in rows], label=k)
    axes[2].set_title("format, forced answers, search rounds")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument(
        "--source",
        choices=("synthetic", "hotpotqa"),
        default="synthetic",
        help="synthetic: 2-way comparisons and 2-hop bridges of the synthetic world (fictional, so the model must "
        "search); hotpotqa: ../shared/data/hotpotqa/dev.jsonl with its corpus",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "learning")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args, grpo_flags = parser.parse_known_args()

    data, corpus = training_questions(args.questions, args.seed, args.run_dir, args.source)
    flags = [
        "--data", data, "--output_dir", str(args.run_dir), "--max_steps", "100000", "--save_steps", "25",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4", "--num_generations", "4",
        "--learning_rate", "5e-5", "--bf16", "true",
        "--temperature", "0.7", "--max_turns", "2", "--topk", "2", "--max_new_tokens", "64",
        "--seed", str(args.seed), *grpo_flags,
    ]  # fmt: skip
    if corpus:
        flags += ["--corpus", corpus]
    started = time.time()
    run_grpo(flags, callbacks=[TimeBudget(args.minutes)])
    minutes = (time.time() - started) / 60

    rows = curves(read_trajectories(args.run_dir))
    checks = {k: thirds(rows, k) for k in ("reward/total", "decomposed/parallelisable", "decomposed/sequential",
                                            "format_valid", "reward/outcome")}  # fmt: skip
    result = {
        "command": "python benchmarks/grpo_check.py " + " ".join(sys.argv[1:]),
        "data": data.replace(f"{ROOT}/", ""),
        "corpus": (corpus or "embedded").replace(f"{ROOT}/", ""),
        "questions": len(load_questions(data)),
        "minutes": minutes,
        "steps": len(rows),
        "first_vs_last_third": checks,
        "curves": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grpo_check.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, figure(args.out / "grpo_check"))
    lines = [
        "# Learning check (GRPO, SmolLM2-135M + LoRA, CPU)",
        "",
        f"`{result['command']}`: {result['steps']} steps in {minutes:.0f} min on {result['questions']} questions "
        f"({result['data']}, corpus {result['corpus']}).",
        "",
        "| signal | first third | last third |",
        "|---|---|---|",
    ]
    for key, (first, last) in checks.items():
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {key} | {fmt(first)} | {fmt(last)} |")
    (args.out / "grpo_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
