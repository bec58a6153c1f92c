"""The learning benchmark: does the trained policy do what ParallelSearch asks, on questions never trained on?

    python benchmarks/learning.py [--per-set 24] [--baseline-per-set 12]

Evaluates greedy, in ``parallel`` and ``sequential`` mode, on held-out sets:
- a synthetic world from a seed and entity set not used for training (``HELD_OUT_SEED``; training uses
  ``ps_agent.synthetic.TRAIN_SEEDS``), every family;
- the validation parts (``ps_agent.questions.read_split``) of the shared HotpotQA and 2Wiki files, each with
  its own corpus, sampled evenly over question types;
for the untrained base model, the base model with the one-shot demonstration, and the trained policies
(``smollm2``: the ParallelSearch adapter in parallel mode, the Search-R1 adapter in sequential mode).
Writes, per set, policy, mode and question class: format-valid %, decomposition ratio (decomposed or not, by
class: the confusion matrix), EM, F1, LLM calls per question, forced-answer %, seconds per question; and the
SFT loss curves, to benchmarks/results/learning.{json,md} and figures/learning.png. Results per question stay in
--run-dir.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, figure, held_out_sets  # noqa: E402
from ps_agent.episodes import aggregate  # noqa: E402
from ps_agent.eval import MODES, EvalSettings, evaluate  # noqa: E402
from ps_agent.eval_report import read_results  # noqa: E402
from ps_agent.llms import TransformersPolicy, embedded_model_path, embedded_spec, load_adapter_model  # noqa: E402
from ps_agent.questions import QUESTION_CLASSES  # noqa: E402
from ps_agent.synthetic import HELD_OUT_SEED  # noqa: E402

POLICIES = ("base", "base+demo", "trained")


def limited(path: Path, n: int) -> Path:
    """The first ``n`` questions of each type of a question file, as ``NAME.baseline/questions.jsonl`` beside
    its folder, with the same corpus."""
    counts: dict[Any, int] = defaultdict(int)
    kept = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        kind = record.get("family", record.get("type"))
        if counts[kind] < n:
            counts[kind] += 1
            kept.append(line)
    folder = path.parent.parent / f"{path.parent.name}.baseline"
    folder.mkdir(exist_ok=True)
    (folder / "questions.jsonl").write_text("\n".join(kept) + "\n")
    if not (folder / "corpus.jsonl").exists():
        (folder / "corpus.jsonl").symlink_to((path.parent / "corpus.jsonl").resolve())
    return folder / "questions.jsonl"


def policy_for(name: str, mode: str, concurrency: int) -> TransformersPolicy:
    """The in-process policy, greedy, batching the concurrent questions' turns."""
    if name == "trained":
        from ps_agent.llms import policies_dir

        policy = TransformersPolicy(*load_adapter_model(policies_dir() / embedded_spec("smollm2", mode)))
    else:
        policy = TransformersPolicy.from_pretrained(embedded_model_path("smollm2"))
    policy.expected = concurrency  # gather the concurrent questions' turns into one batch
    policy.batch_window_s = 0.5
    return policy


def by_policy(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per set × policy × mode, overall and per class."""
    out: dict[str, Any] = {}
    for r in records:
        out.setdefault(r["dataset"], {}).setdefault(r["policy"], {}).setdefault(r["mode"], [])
        out[r["dataset"]][r["policy"]][r["mode"]].append(r)
    return {
        d: {
            p: {
                m: {"all": aggregate(rs)} | {c: aggregate([r for r in rs if r["question_class"] == c])
                                         for c in QUESTION_CLASSES if any(r["question_class"] == c for r in rs)}
                for m, rs in modes.items()
            }
            for p, modes in policies.items()
        }
        for d, policies in out.items()
    }  # fmt: skip


def calls_ratio(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """LLM calls of the trained policy on parallelisable questions, parallel mode over sequential mode (a ratio
    of sums), on the questions both modes ran without error, per set."""
    ratios = {}
    for d in sorted({r["dataset"] for r in records}):
        ran = {
            m: {r["id"]: float(r["llm_calls"]) for r in records if r["dataset"] == d and r["policy"] == "trained"
                and r["mode"] == m and r["question_class"] == "parallelisable" and r["error"] is None}
            for m in MODES
        }  # fmt: skip
        both = ran["parallel"].keys() & ran["sequential"].keys()
        calls = {m: sum(ran[m][q] for q in both) for m in MODES}
        ratios[d] = calls["parallel"] / calls["sequential"] if both and calls["sequential"] else None
    return ratios


def markdown(result: dict[str, Any]) -> str:
    f = lambda v, d=0: "–" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [
        "# Learning benchmark: held-out questions, greedy",
        "",
        f"`{result['command']}` — {result['minutes']:.0f} min. Sets: {', '.join(result['sets'])}.",
        "",
        "Trained policies: `policies/smollm2-parallelsearch` (parallel mode) and `policies/smollm2-searchr1`"
        " (sequential mode); base = untrained SmolLM2-135M-Instruct; base+demo = with the one-shot demonstration"
        f" (baselines: the first {result['baselines']['per_type']} question(s) of each type of "
        f"{', '.join(result['baselines']['sets'])}). Greedy, max_turns 4, top-3 passages per sub-query, BM25.",
        "",
        "LLM calls on parallelisable questions, trained policy, parallel ÷ sequential mode: "
        + ", ".join(f"{d} {f(v and 100 * v)}%" for d, v in result["calls_ratio_parallelisable"].items()),
        "",
    ]
    for d, policies in result["summary"].items():
        lines += [f"## {d}", "", "| policy | mode | class | n | format % | decomposed % | EM % | F1 % | calls | "
                  "forced % | s/question |", "|---" * 11 + "|"]  # fmt: skip
        for p, modes in policies.items():
            for m, classes in modes.items():
                for c, t in classes.items():
                    cells = [f(t.get(k)) for k in ("format_valid", "decomposition_ratio", "em", "f1")]
                    cells += [f(t.get("turns"), 2), f(t.get("forced_answer")), f(t.get("seconds_per_question"), 1)]
                    lines.append(f"| {p} | {m} | {c} | {t['n']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def loss_curves(runs: dict[str, Path]) -> dict[str, list[tuple[int, float]]]:
    """(step, loss) of each SFT run, from its trainer state."""
    curves = {}
    for name, run in runs.items():
        states = sorted(run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
        states += [run / "trainer_state.json"] if (run / "trainer_state.json").is_file() else []
        if states:
            history = json.loads(states[-1].read_text())["log_history"]
            curves[name] = [(h["step"], h["loss"]) for h in history if "loss" in h]
    return curves


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for name, curve in result["sft_loss"].items():
        axes[0].plot([s for s, _ in curve], [v for _, v in curve], label=name)
    axes[0].set_title("SFT loss (model tokens)")
    axes[0].set_xlabel("step")
    labels, values = [], defaultdict(list)
    for d, policies in result["summary"].items():
        for c in ("parallelisable", "sequential"):
            labels.append(f"{d}\n{c}")
            for p in POLICIES:
                t = policies.get(p, {}).get("parallel", {}).get(c, {})
                values[p].append(t.get("decomposition_ratio") or 0.0)
    width = 0.8 / len(POLICIES)
    for i, p in enumerate(POLICIES):
        axes[1].bar([x + i * width for x in range(len(labels))], values[p], width, label=p)
    axes[1].set_xticks([x + width for x in range(len(labels))], labels, fontsize=7)
    axes[1].set_title("decomposed % (parallel mode)")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-set", type=int, default=24, help="questions per shared validation sample")
    parser.add_argument("--baseline-per-set", type=int, default=3, help="questions per type for the baselines")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument(
        "--baseline-sets", nargs="+", default=None, help="the sets the baselines run on (default: every set)"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "learning")
    parser.add_argument("--sft-runs", nargs="*", default=["runs/sft-parallel", "runs/sft-sequential"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    started = time.time()
    sets = held_out_sets(args.run_dir / "sets", args.per_set)
    unknown = sorted(set(args.baseline_sets or ()) - set(sets))
    if unknown:
        parser.error(f"--baseline-sets {' '.join(unknown)}: expected some of {', '.join(sets)}")
    baseline_sets = [sets[name] for name in args.baseline_sets or sets]
    records = []
    for policy in args.policies:
        files = (
            list(sets.values()) if policy == "trained" else [limited(p, args.baseline_per_set) for p in baseline_sets]
        )
        for mode in MODES:
            out_dir = args.run_dir / policy / mode
            settings = EvalSettings(
                llm=policy_for(policy, mode, args.concurrency),
                retriever="auto",
                modes=(mode,),
                concurrency=args.concurrency,
                agent={"demonstration": policy == "base+demo", "max_new_tokens": args.max_new_tokens},
            )
            evaluate(files, out_dir, settings)
            for r in read_results(out_dir):
                records.append(r | {"policy": policy, "dataset": r["dataset"].removesuffix(".baseline")})
    result = {
        "command": "python benchmarks/learning.py " + " ".join(sys.argv[1:]),
        "minutes": (time.time() - started) / 60,
        "sets": {k: str(v.relative_to(ROOT)) if v.is_relative_to(ROOT) else str(v) for k, v in sets.items()},
        "held_out_seed": HELD_OUT_SEED,
        "baselines": {"sets": args.baseline_sets or list(sets), "per_type": args.baseline_per_set},
        "summary": by_policy(records),
        "calls_ratio_parallelisable": calls_ratio(records),
        "sft_loss": loss_curves({Path(r).name: ROOT / r for r in args.sft_runs}),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learning.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "learning.md").write_text(markdown(result))
    plot(result, figure(args.out / "learning"))
    print(markdown(result))


if __name__ == "__main__":
    main()
